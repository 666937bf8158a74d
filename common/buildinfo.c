#include "buildinfo.h"

#include "wb_build_rev.h"
#include "wire.h"

const char *wb__build_rev(void)
{
    return WB_GIT_REV;
}

const char *wb__build_backends(void)
{
#ifdef WB_HAVE_CUDA
    return "host cuda vmm";
#else
    return "host";
#endif
}

void wb__print_version(FILE *out, const char *prog, const char *features)
{
    fprintf(out, "%s %s (git %s, protocol %d)\nbackends: %s\n", prog, WB_VERSION, wb__build_rev(),
            WB_PROTOCOL_VERSION, wb__build_backends());
    if (features && features[0])
        fprintf(out, "features: %s\n", features);
}
