"""Exceptions raised by weightbroker: every failure of libwbclient becomes a
BrokerError carrying the C status code, its symbolic name and the library's
detailed message."""


class BrokerError(Exception):
    """A libwbclient call failed.

    status: the negative wb_status code (e.g. -7); name: its symbolic name
    ("WB_EBUSY"); message: the library's detailed message."""

    def __init__(self, status, name, message):
        super().__init__("%s: %s" % (name, message))
        self.status = status
        self.name = name
        self.message = message


class NotFoundError(BrokerError):
    """WB_ENOTFOUND: no such model, lease, tensor or file."""


class PermissionDeniedError(BrokerError):
    """WB_EPERM: the broker refuses this process."""


class LimitError(BrokerError):
    """WB_ELIMIT: a configured limit was reached (leases, memory)."""


class BusyError(BrokerError):
    """WB_EBUSY: the object is still in use (models or tensor views on a lease)."""


class StateError(BrokerError):
    """WB_ESTATE: the object is in the wrong state (model loading or draining)."""


class ConnectError(BrokerError):
    """WB_ECONN or WB_ETIMEDOUT: the broker cannot be reached."""


class CorruptError(BrokerError):
    """WB_ECORRUPT: leased bytes no longer match the broker's checksum."""


# Status code -> exception class; codes not listed raise BrokerError itself.
_BY_STATUS = {
    -4: NotFoundError,
    -8: PermissionDeniedError,
    -12: LimitError,
    -7: BusyError,
    -9: StateError,
    -14: ConnectError,
    -10: ConnectError,
    -18: CorruptError,
}


def error_for(status, name, message):
    """The exception for a C status code."""
    return _BY_STATUS.get(status, BrokerError)(status, name, message)


class LibraryNotFoundError(ImportError):
    """libwbclient.so could not be loaded; the message lists every place tried."""
