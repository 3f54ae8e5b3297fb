/*
 * fake_nvml.c — a stand-in for libnvidia-ml.so.1 in tests of package devices, built by the test
 * with gcc -shared. Two GPUs; the used memory of the first is read from the file named by
 * FAKE_NVML_USED_FILE (bytes, decimal) so a test can move it; FAKE_NVML_INIT makes nvmlInit_v2
 * return that status (9: driver not loaded).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    const char *name, *bus;
    unsigned long long total, used;
    int major, minor;
} fake_dev;

static fake_dev devs[2] = {
    {"NVIDIA H100 80GB HBM3", "00000000:3B:00.0", 85520809984ull, 1048576000ull, 9, 0},
    {"NVIDIA A100-SXM4-40GB", "00000000:86:00.0", 42949672960ull, 4194304ull, 8, 0},
};
static int inited;

int nvmlInit_v2(void) {
    const char *e = getenv("FAKE_NVML_INIT");
    if (e && atoi(e)) return atoi(e);
    inited++;
    return 0;
}
int nvmlShutdown(void) { return inited-- > 0 ? 0 : 1; }
const char *nvmlErrorString(int st) { return st == 6 ? "Not Found" : "fake nvml error"; }
int nvmlDeviceGetCount_v2(unsigned int *n) { *n = 2; return inited ? 0 : 1; }
int nvmlDeviceGetHandleByIndex_v2(unsigned int i, void **h) {
    if (i >= 2) return 2;
    *h = &devs[i];
    return 0;
}
int nvmlDeviceGetHandleByPciBusId_v2(const char *bus, void **h) {
    for (int i = 0; i < 2; i++) {
        /* NVML accepts either spelling of the domain */
        const char *want = devs[i].bus + 4;
        const char *got = strlen(bus) > 12 ? bus + strlen(bus) - 12 : bus;
        if (strcasecmp(got, want) == 0) {
            *h = &devs[i];
            return 0;
        }
    }
    return 6;
}
int nvmlDeviceGetName(void *h, char *s, unsigned int n) {
    snprintf(s, n, "%s", ((fake_dev *)h)->name);
    return 0;
}
int nvmlDeviceGetPciInfo_v3(void *h, nvmlPciInfo_t *p) {
    memset(p, 0, sizeof *p);
    snprintf(p->busId, sizeof p->busId, "%s", ((fake_dev *)h)->bus);
    return 0;
}
int nvmlDeviceGetMemoryInfo(void *h, nvmlMemory_t *m) {
    fake_dev *d = h;
    m->total = d->total;
    m->used = d->used;
    const char *f = getenv("FAKE_NVML_USED_FILE");
    if (d == &devs[0] && f) {
        FILE *fp = fopen(f, "r");
        if (!fp) return 999;
        if (fscanf(fp, "%llu", &m->used) != 1) m->used = 0;
        fclose(fp);
    }
    m->free = m->total - m->used;
    return 0;
}
int nvmlDeviceGetCudaComputeCapability(void *h, int *major, int *minor) {
    *major = ((fake_dev *)h)->major;
    *minor = ((fake_dev *)h)->minor;
    return 0;
}
int nvmlSystemGetDriverVersion(char *s, unsigned int n) {
    snprintf(s, n, "580.159.04");
    return 0;
}
