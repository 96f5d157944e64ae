/*
 * A fake libnvidia-ml.so.1 for testing fastprof's NVML path on machines
 * without an NVIDIA GPU or driver (see README.md). It exports the NVML entry
 * points that nvml-wrapper 0.13 (the Rust sampler) and pynvml (the Python
 * inventory) call, with NVML's signatures, struct layouts and return codes.
 *
 * Two devices:
 *   0  supports every field read by fastprof;
 *   1  returns NVML_ERROR_NOT_SUPPORTED for the total energy counter and for
 *      PCIe throughput (so its energy must come from integrated power).
 *
 * Both follow one "load" (0-100) read from the file named by the environment
 * variable FAKE_NVML_LOAD_FILE at every query (a test rewrites it while the
 * process runs), else from FAKE_NVML_LOAD, else 0. Readings:
 *   utilization  gpu = load %, memory = load / 2 %
 *   power        60 W + 2.4 W * load                    (enforced limit 300 W)
 *   energy       mJ, power integrated over CLOCK_MONOTONIC since the first
 *                nvmlInit, starting at 5,000,000 mJ; the load seen at the
 *                previous query holds until this one, so power and energy agree
 *   memory       total 16 GiB (dev 0) / 8 GiB (dev 1), reserved 256 MiB,
 *                used 512 MiB + 64 MiB * load
 *   clocks       SM 210 + 15 * load MHz, memory 1593 MHz
 *   temperature  30 + load / 2 C
 *   throttle     GPU_IDLE (0x1) below load 5, SW_POWER_CAP (0x4) from load 80
 *   PCIe         RX 100 + 1000 * load KB/s, TX 50 + 500 * load KB/s (dev 0)
 *
 * Build: gcc -shared -fPIC -O2 -o libnvidia-ml.so.1 fake_nvml.c
 * Define FAKE_NVML_OMIT_ENERGY to leave nvmlDeviceGetTotalEnergyConsumption
 * out of the library (a driver too old to have it).
 */

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

/* nvmlClockType_t, nvmlTemperatureSensors_t, nvmlPcieUtilCounter_t */
enum { NVML_CLOCK_GRAPHICS = 0, NVML_CLOCK_SM = 1, NVML_CLOCK_MEM = 2, NVML_CLOCK_VIDEO = 3 };
enum { NVML_TEMPERATURE_GPU = 0 };
enum { NVML_PCIE_UTIL_TX_BYTES = 0, NVML_PCIE_UTIL_RX_BYTES = 1 };

#define THROTTLE_GPU_IDLE 0x1ULL
#define THROTTLE_SW_POWER_CAP 0x4ULL

typedef struct {
    unsigned int gpu;
    unsigned int memory;
} nvmlUtilization_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used;
} nvmlMemory_v2_t;

#define NVML_MEMORY_V2_VERSION ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

#define MIB (1ULL << 20)
#define GIB (1ULL << 30)
#define NDEV 2

struct fake_device {
    unsigned int index;
    const char *uuid;
    unsigned long long mem_total;
    int has_energy;
    int has_pcie;
};

/* nvmlDevice_t is an opaque pointer: here, a pointer into this table. */
static struct fake_device devices[NDEV] = {
    {0, "GPU-fake-0000-0000-0000-000000000000", 16 * GIB, 1, 1},
    {1, "GPU-fake-0001-0000-0000-000000000000", 8 * GIB, 0, 0},
};
typedef struct fake_device *nvmlDevice_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int init_count;   /* nvmlInit calls not yet matched by nvmlShutdown */
static int clock_started; /* the energy clock runs from the first init on */
static double last_s;     /* CLOCK_MONOTONIC of the previous query */
static double load;       /* load seen at the previous query */
static double energy_mj = 5e6;

static double mono_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static double power_mw(double l) { return 60000.0 + 2400.0 * l; }

/* The load now; a missing or half-written file keeps the previous value. */
static double read_load(double previous) {
    const char *path = getenv("FAKE_NVML_LOAD_FILE");
    char buf[64] = {0};
    const char *text = NULL;
    if (path) {
        FILE *f = fopen(path, "r");
        if (!f)
            return previous;
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[n] = 0;
        text = buf;
    } else {
        text = getenv("FAKE_NVML_LOAD");
    }
    if (!text)
        return 0.0;
    char *end;
    double v = strtod(text, &end);
    if (end == text)
        return previous;
    return v < 0 ? 0 : v > 100 ? 100 : v;
}

/* Advance the energy integral to now, then take the current load. Lock held. */
static void advance(void) {
    double now = mono_s();
    energy_mj += power_mw(load) * (now - last_s); /* mW * s = mJ */
    last_s = now;
    load = read_load(load);
}

/* Validate a handle and take a consistent snapshot of the state. */
static nvmlReturn_t query(nvmlDevice_t d, double *l, double *e) {
    nvmlReturn_t r = NVML_SUCCESS;
    pthread_mutex_lock(&lock);
    if (init_count == 0) {
        r = NVML_ERROR_UNINITIALIZED;
    } else if (d != &devices[0] && d != &devices[1]) {
        r = NVML_ERROR_INVALID_ARGUMENT;
    } else {
        advance();
        *l = load;
        if (e)
            *e = energy_mj;
    }
    pthread_mutex_unlock(&lock);
    return r;
}

/* query(), then NVML_ERROR_INVALID_ARGUMENT for a NULL output pointer. */
static nvmlReturn_t reading(nvmlDevice_t d, double *l, double *e, const void *out) {
    nvmlReturn_t r = query(d, l, e);
    if (r == NVML_SUCCESS && !out)
        return NVML_ERROR_INVALID_ARGUMENT;
    return r;
}

static nvmlReturn_t copy_string(const char *s, char *out, unsigned int length) {
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(s) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, s, strlen(s) + 1);
    return NVML_SUCCESS;
}

/* ------------------------------------------------------------ library */

static nvmlReturn_t do_init(void) {
    pthread_mutex_lock(&lock);
    if (!clock_started) {
        clock_started = 1;
        last_s = mono_s();
        load = read_load(0.0);
    }
    init_count++;
    pthread_mutex_unlock(&lock);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return do_init(); }
EXPORT nvmlReturn_t nvmlInit(void) { return do_init(); }
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return do_init();
}

EXPORT nvmlReturn_t nvmlShutdown(void) {
    nvmlReturn_t r = NVML_SUCCESS;
    pthread_mutex_lock(&lock);
    if (init_count == 0)
        r = NVML_ERROR_UNINITIALIZED;
    else
        init_count--;
    pthread_mutex_unlock(&lock);
    return r;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS:
        return "Success";
    case NVML_ERROR_UNINITIALIZED:
        return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT:
        return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED:
        return "Not Supported";
    case NVML_ERROR_NOT_FOUND:
        return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE:
        return "Insufficient Size";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH:
        return "Argument version mismatch";
    default:
        return "Unknown Error";
    }
}

static int initialized(void) {
    pthread_mutex_lock(&lock);
    int n = init_count;
    pthread_mutex_unlock(&lock);
    return n > 0;
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    return copy_string("999.99", version, length);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = NDEV;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= NDEV)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[index];
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    if (!initialized())
        return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < NDEV; i++) {
        if (strcmp(uuid, devices[i].uuid) == 0) {
            *device = &devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

/* ------------------------------------------------------------ static facts */

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *index) {
    double l;
    nvmlReturn_t r = reading(d, &l, NULL, index);
    if (r == NVML_SUCCESS)
        *index = d->index;
    return r;
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int length) {
    double l;
    nvmlReturn_t r = query(d, &l, NULL);
    return r == NVML_SUCCESS ? copy_string("Fake GPU", name, length) : r;
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int length) {
    double l;
    nvmlReturn_t r = query(d, &l, NULL);
    return r == NVML_SUCCESS ? copy_string(d->uuid, uuid, length) : r;
}

EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t d, unsigned int *limit) {
    double l;
    nvmlReturn_t r = reading(d, &l, NULL, limit);
    if (r == NVML_SUCCESS)
        *limit = 300000;
    return r;
}

/* ------------------------------------------------------------ readings */

static unsigned long long mem_used(double l) { return 512 * MIB + (unsigned long long)(l * 64.0) * MIB; }
#define MEM_RESERVED (256 * MIB)

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *m) {
    double l;
    nvmlReturn_t r = reading(d, &l, NULL, m);
    if (r != NVML_SUCCESS)
        return r;
    /* v1 counts the reserved memory as used */
    m->total = d->mem_total;
    m->used = mem_used(l) + MEM_RESERVED;
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    double l;
    nvmlReturn_t r = reading(d, &l, NULL, m);
    if (r != NVML_SUCCESS)
        return r;
    if (m->version != NVML_MEMORY_V2_VERSION)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    m->total = d->mem_total;
    m->reserved = MEM_RESERVED;
    m->used = mem_used(l);
    m->free = m->total - m->reserved - m->used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t d, nvmlUtilization_t *u) {
    double l;
    nvmlReturn_t r = reading(d, &l, NULL, u);
    if (r != NVML_SUCCESS)
        return r;
    u->gpu = (unsigned int)(l + 0.5);
    u->memory = (unsigned int)(l / 2.0 + 0.5);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t d, unsigned int *power) {
    double l;
    nvmlReturn_t r = reading(d, &l, NULL, power);
    if (r != NVML_SUCCESS)
        return r;
    *power = (unsigned int)(power_mw(l) + 0.5);
    return NVML_SUCCESS;
}

#ifndef FAKE_NVML_OMIT_ENERGY
EXPORT nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t d, unsigned long long *energy) {
    double l, e;
    nvmlReturn_t r = query(d, &l, &e);
    if (r != NVML_SUCCESS)
        return r;
    if (!d->has_energy)
        return NVML_ERROR_NOT_SUPPORTED;
    if (!energy)
        return NVML_ERROR_INVALID_ARGUMENT;
    *energy = (unsigned long long)e;
    return NVML_SUCCESS;
}
#endif

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t d, int type, unsigned int *clock) {
    double l;
    nvmlReturn_t r = reading(d, &l, NULL, clock);
    if (r != NVML_SUCCESS)
        return r;
    switch (type) {
    case NVML_CLOCK_GRAPHICS:
    case NVML_CLOCK_SM:
        *clock = 210 + (unsigned int)(15.0 * l + 0.5);
        return NVML_SUCCESS;
    case NVML_CLOCK_MEM:
        *clock = 1593;
        return NVML_SUCCESS;
    case NVML_CLOCK_VIDEO:
        *clock = 1275;
        return NVML_SUCCESS;
    default:
        return NVML_ERROR_INVALID_ARGUMENT;
    }
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, int sensor, unsigned int *temp) {
    double l;
    nvmlReturn_t r = query(d, &l, NULL);
    if (r != NVML_SUCCESS)
        return r;
    if (!temp || sensor != NVML_TEMPERATURE_GPU)
        return NVML_ERROR_INVALID_ARGUMENT;
    *temp = 30 + (unsigned int)(l / 2.0 + 0.5);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t d, unsigned long long *reasons) {
    double l;
    nvmlReturn_t r = reading(d, &l, NULL, reasons);
    if (r != NVML_SUCCESS)
        return r;
    *reasons = l < 5 ? THROTTLE_GPU_IDLE : l >= 80 ? THROTTLE_SW_POWER_CAP : 0;
    return NVML_SUCCESS;
}
/* The older name of the same call (what nvml-wrapper 0.13 resolves). */
EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t d, unsigned long long *reasons) {
    return nvmlDeviceGetCurrentClocksEventReasons(d, reasons);
}

EXPORT nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t d, int counter, unsigned int *kb_per_s) {
    double l;
    nvmlReturn_t r = query(d, &l, NULL);
    if (r != NVML_SUCCESS)
        return r;
    if (!d->has_pcie)
        return NVML_ERROR_NOT_SUPPORTED;
    if (!kb_per_s)
        return NVML_ERROR_INVALID_ARGUMENT;
    switch (counter) {
    case NVML_PCIE_UTIL_RX_BYTES:
        *kb_per_s = 100 + (unsigned int)(1000.0 * l + 0.5);
        return NVML_SUCCESS;
    case NVML_PCIE_UTIL_TX_BYTES:
        *kb_per_s = 50 + (unsigned int)(500.0 * l + 0.5);
        return NVML_SUCCESS;
    default:
        return NVML_ERROR_INVALID_ARGUMENT;
    }
}
