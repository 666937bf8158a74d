"""weightbroker: lease model weights shared by a wbrokerd daemon and run
PyTorch AOTInductor models on them, from Python.

    import weightbroker
    with weightbroker.connect() as client, client.lease("base") as lease:
        weights = lease.tensors()          # {name: torch.Tensor}, no copy
        model = weightbroker.load_aoti("variant.pt2", [lease])
        y = model(x)[0]
        del model, weights                 # a lease in use cannot be released

Pure Python over libwbclient.so (ctypes); set $WB_CLIENT_LIBRARY to the
library (or its directory) when it is not on the linker's path."""

from .aoti import Model, load_aoti
from .client import Client, Lease, TensorInfo, connect
from .errors import (BrokerError, BusyError, ConnectError, CorruptError, LibraryNotFoundError,
                     LimitError, NotFoundError, PermissionDeniedError, StateError)
from .publish import Publisher

__version__ = "0.1.0"

__all__ = [
    "BrokerError", "BusyError", "Client", "ConnectError", "CorruptError", "Lease",
    "LibraryNotFoundError", "LimitError", "Model", "NotFoundError", "PermissionDeniedError",
    "Publisher", "StateError", "TensorInfo", "connect", "load_aoti",
]
