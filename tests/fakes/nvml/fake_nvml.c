/*
 * A fake libnvidia-ml.so.1 for tests: the NVML C ABI that pynvml (nvidia-ml-py) calls, answered from a
 * line-based configuration file instead of a GPU.
 *
 * Why C and not a Python mock: the auditor must survive pynvml's own ctypes code (versioned structs, the
 * process-list size protocol, 0xFFFFFFFF instance ids without MIG), and only a real shared library loaded
 * by the real pynvml exercises that. The format of the configuration is documented in docs/nvml.md and
 * written by tests/fakes/nvml/__init__.py (FakeNvmlConfig); each line is one of
 *
 *   driver <version>
 *   max_slices <n>
 *   gpu <index> <uuid> <minor> <total_bytes> [mig=0|1] [max_slices=<n>] <name...>
 *   mig <parent_index> <slot> <uuid> <gpu_instance_id> <compute_instance_id> <slices> <total_bytes> [<name...>]
 *   proc <device> <compute|graphics|mps> <pid> <used_bytes|na> [gi=<n>] [ci=<n>]
 *   error <function> <nvml_return_code> [device=<uuid|gpu_index>] [times=<n>]
 *   util <device> <pid> <sm> <mem> <enc> <dec> [jpg=<n>] [ofa=<n>] [at=<cpu_us>]
 *   util_period <us>
 *   mps_server <device> <pid> <used_bytes|na>
 *   log <path>
 *
 * The file named by FAKE_NVML_CONFIG is read when the init reference count goes from 0 to 1, so a test can
 * change it between nvmlShutdown and the next nvmlInit. Device handles point into static storage, so a
 * handle kept across a re-init stays a valid pointer (it then names whatever the new file put there).
 *
 * Extra exported symbols for tests (not NVML): fakeNvmlCallCount(name), fakeNvmlResultCount(name, code),
 * fakeNvmlResetCounts(), and fakeNvmlSetClock(us): the CPU time in microseconds the fake says it is, for live
 * samples' timestamps (0, and at every configuration load: the real clock), so that a test moves time instead of
 * sleeping through it.
 */

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

typedef int nvmlReturn_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

#define NO_INSTANCE 0xFFFFFFFFu /* nvml.h: gpuInstanceId / computeInstanceId when MIG is not enabled */
#define VALUE_NOT_AVAILABLE 0xFFFFFFFFFFFFFFFFull
#define MAX_GPUS 64
#define MAX_MIG 8 /* slots per GPU: 7 on A100/H100, 8 on newer parts */
#define TEXT_LEN 96 /* NVML_DEVICE_UUID_V2_BUFFER_SIZE and NVML_DEVICE_NAME_V2_BUFFER_SIZE */
#define MAX_ERRORS 64

/* nvml.h: nvmlProcessInfo_v2_t (also the layout of _v3 and of nvmlProcessInfo_t). */
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

/* nvml.h: nvmlProcessUtilizationSample_t (nvmlDeviceGetProcessUtilization). */
typedef struct {
    unsigned int pid;
    unsigned long long timeStamp; /* CPU timestamp in microseconds */
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

/* nvml.h: nvmlProcessUtilizationInfo_v1_t and nvmlProcessesUtilizationInfo_v1_t
 * (nvmlDeviceGetProcessesUtilizationInfo), with the struct's version as NVML_STRUCT_VERSION makes it. */
typedef struct {
    unsigned long long timeStamp;
    unsigned int pid, smUtil, memUtil, encUtil, decUtil, jpgUtil, ofaUtil;
} nvmlProcessUtilizationInfo_v1_t;

typedef struct {
    unsigned int version;
    unsigned int processSamplesCount;
    unsigned long long lastSeenTimeStamp;
    nvmlProcessUtilizationInfo_v1_t *procUtilArray;
} nvmlProcessesUtilizationInfo_v1_t;
#define nvmlProcessesUtilizationInfo_v1 (unsigned int)(sizeof(nvmlProcessesUtilizationInfo_v1_t) | (1 << 24))

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
#define nvmlMemory_v2 (unsigned int)(sizeof(nvmlMemory_v2_t) | (2 << 24))

typedef struct {
    unsigned int multiprocessorCount, sharedCopyEngineCount, sharedDecoderCount, sharedEncoderCount;
    unsigned int sharedJpegCount, sharedOfaCount, gpuInstanceSliceCount, computeInstanceSliceCount;
    unsigned long long memorySizeMB;
} nvmlDeviceAttributes_t;

typedef struct {
    unsigned int version, id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount;
    unsigned int copyEngineCount, decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
    char name[TEXT_LEN];
} nvmlGpuInstanceProfileInfo_v2_t;
#define nvmlGpuInstanceProfileInfo_v2 (unsigned int)(sizeof(nvmlGpuInstanceProfileInfo_v2_t) | (2 << 24))

enum kind { K_COMPUTE, K_GRAPHICS, K_MPS, K_COUNT };

struct proc_list {
    nvmlProcessInfo_t *items;
    unsigned int count;
};

/* One "util" line: a process's utilisation sample. `at` 0 is a live sample, stamped at the latest multiple of
 * util_period not after the query (a driver that keeps sampling); otherwise the fixed CPU timestamp given. */
struct util_sample {
    unsigned int pid, sm, mem, enc, dec, jpg, ofa;
    unsigned long long at;
};

struct util_list {
    struct util_sample *items;
    unsigned int count, capacity;
};

struct device {
    int in_use;
    int is_mig;
    unsigned int index; /* GPU: its NVML index; MIG device: its slot under the parent */
    unsigned int minor;
    char uuid[TEXT_LEN];
    char name[TEXT_LEN];
    unsigned long long total;
    int mig_enabled;
    unsigned int max_slices;
    struct device *parent;
    struct device *mig[MAX_MIG];
    unsigned int gi, ci, slices;
    struct proc_list procs[K_COUNT];
    struct util_list samples;
    int mps_server; /* an MPS server runs on this device ("mps_server" line) */
    unsigned int mps_server_pid;
};
typedef struct device *nvmlDevice_t;

struct error_rule {
    char function[64];
    nvmlReturn_t code;
    char device[TEXT_LEN]; /* "" = any device */
    int times;             /* < 0 = every call */
};

/* One parsed "proc" line, before the per-device lists are built. */
struct proc_line {
    struct device *gpu;
    struct device *mig; /* NULL when not inside a known MIG device */
    enum kind kind;
    nvmlProcessInfo_t info;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int refcount;
static struct device gpus[MAX_GPUS];
static struct device migs[MAX_GPUS][MAX_MIG];
static unsigned int gpu_count;
static char driver_version[TEXT_LEN];
static unsigned int default_max_slices;
static struct error_rule errors[MAX_ERRORS];
static int error_count;
static FILE *log_file;
static unsigned long long util_period_us;
static unsigned long long fixed_now_us; /* 0: the real clock (fakeNvmlSetClock) */

/* ---- call accounting: lets tests assert that pynvml's size-probe path really ran ---- */

static const char *const function_names[] = {
    "nvmlInit_v2", "nvmlInitWithFlags", "nvmlShutdown", "nvmlSystemGetDriverVersion", "nvmlSystemGetNVMLVersion",
    "nvmlDeviceGetCount_v2", "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByUUID", "nvmlDeviceGetUUID",
    "nvmlDeviceGetName", "nvmlDeviceGetMinorNumber", "nvmlDeviceGetIndex", "nvmlDeviceGetMemoryInfo",
    "nvmlDeviceGetMemoryInfo_v2", "nvmlDeviceGetMigMode", "nvmlDeviceGetMaxMigDeviceCount",
    "nvmlDeviceGetMigDeviceHandleByIndex", "nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle", "nvmlDeviceIsMigDeviceHandle", "nvmlDeviceGetAttributes_v2",
    "nvmlDeviceGetGpuInstanceProfileInfoV", "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2", "nvmlDeviceGetGraphicsRunningProcesses_v3",
    "nvmlDeviceGetGraphicsRunningProcesses_v2", "nvmlDeviceGetMPSComputeRunningProcesses_v3",
    "nvmlDeviceGetMPSComputeRunningProcesses_v2", "nvmlDeviceGetProcessUtilization",
    "nvmlDeviceGetProcessesUtilizationInfo",
};
enum {
    F_INIT_V2, F_INIT_FLAGS, F_SHUTDOWN, F_DRIVER_VERSION, F_NVML_VERSION, F_COUNT, F_HANDLE_BY_INDEX,
    F_HANDLE_BY_UUID, F_UUID, F_NAME, F_MINOR, F_INDEX, F_MEMORY, F_MEMORY_V2, F_MIG_MODE, F_MAX_MIG,
    F_MIG_HANDLE, F_GI, F_CI, F_PARENT, F_IS_MIG, F_ATTRIBUTES, F_PROFILE, F_COMPUTE_V3, F_COMPUTE_V2,
    F_GRAPHICS_V3, F_GRAPHICS_V2, F_MPS_V3, F_MPS_V2, F_PROCESS_UTIL,
    F_PROCESSES_UTIL_INFO, F_FUNCTIONS
};
#define RESULT_SLOTS 33 /* return codes 0..31, and one slot for everything else (999 = unknown) */
static unsigned int call_counts[F_FUNCTIONS];
static unsigned int result_counts[F_FUNCTIONS][RESULT_SLOTS];

static int result_slot(nvmlReturn_t code) { return code >= 0 && code < RESULT_SLOTS - 1 ? code : RESULT_SLOTS - 1; }

static int function_id(const char *name) {
    for (int f = 0; f < F_FUNCTIONS; f++)
        if (strcmp(function_names[f], name) == 0) return f;
    return -1;
}

unsigned int fakeNvmlCallCount(const char *name) {
    int f = name ? function_id(name) : -1;
    return f < 0 ? 0 : __atomic_load_n(&call_counts[f], __ATOMIC_RELAXED);
}

unsigned int fakeNvmlResultCount(const char *name, int code) {
    int f = name ? function_id(name) : -1;
    return f < 0 ? 0 : __atomic_load_n(&result_counts[f][result_slot(code)], __ATOMIC_RELAXED);
}

void fakeNvmlResetCounts(void) {
    pthread_mutex_lock(&lock);
    memset(call_counts, 0, sizeof call_counts);
    memset(result_counts, 0, sizeof result_counts);
    pthread_mutex_unlock(&lock);
}

static nvmlReturn_t finish(int f, nvmlReturn_t code) {
    __atomic_add_fetch(&call_counts[f], 1, __ATOMIC_RELAXED);
    __atomic_add_fetch(&result_counts[f][result_slot(code)], 1, __ATOMIC_RELAXED);
    if (log_file) fprintf(log_file, "%s %d\n", function_names[f], code);
    return code;
}

/* ---- injected errors ---- */

static int device_matches(const struct error_rule *rule, const struct device *d, long index) {
    if (rule->device[0] == '\0') return 1;
    if (d && strcmp(rule->device, d->uuid) == 0) return 1;
    char *end;
    long wanted = strtol(rule->device, &end, 10);
    if (*end != '\0') return 0;
    if (d && !d->is_mig) return (long)d->index == wanted;
    return index >= 0 && index == wanted;
}

/* The injected return code for this call, or NVML_SUCCESS. `index` is for calls that take an index, not a handle. */
static nvmlReturn_t injected(int f, const struct device *d, long index) {
    nvmlReturn_t code = NVML_SUCCESS;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < error_count; i++) {
        struct error_rule *rule = &errors[i];
        if (rule->times == 0 || strcmp(rule->function, function_names[f]) != 0) continue;
        if (!device_matches(rule, d, index)) continue;
        if (rule->times > 0) rule->times--;
        code = rule->code;
        break;
    }
    pthread_mutex_unlock(&lock);
    return code;
}

static int valid_device(const struct device *d) {
    if (d >= &gpus[0] && d < &gpus[MAX_GPUS]) return d->in_use;
    if (d >= &migs[0][0] && d < &migs[0][0] + MAX_GPUS * MAX_MIG) return d->in_use;
    return 0;
}

/* Common prologue of every device call: initialised? a handle we handed out? an injected error? */
static nvmlReturn_t begin(int f, const struct device *d) {
    if (refcount == 0) return NVML_ERROR_UNINITIALIZED;
    if (!valid_device(d)) return NVML_ERROR_INVALID_ARGUMENT;
    return injected(f, d, -1);
}

#define BEGIN(f, d)                                                                                               \
    do {                                                                                                          \
        nvmlReturn_t begin_code = begin((f), (d));                                                                \
        if (begin_code != NVML_SUCCESS) return finish((f), begin_code);                                          \
    } while (0)

/* ---- configuration ---- */

static void clear_state(void) {
    for (unsigned int g = 0; g < MAX_GPUS; g++) {
        for (int k = 0; k < K_COUNT; k++) free(gpus[g].procs[k].items);
        free(gpus[g].samples.items);
        for (unsigned int m = 0; m < MAX_MIG; m++) {
            for (int k = 0; k < K_COUNT; k++) free(migs[g][m].procs[k].items);
            free(migs[g][m].samples.items);
        }
    }
    memset(gpus, 0, sizeof gpus);
    memset(migs, 0, sizeof migs);
    gpu_count = 0;
    memset(errors, 0, sizeof errors);
    error_count = 0;
    default_max_slices = 7;
    util_period_us = 100000;
    __atomic_store_n(&fixed_now_us, 0, __ATOMIC_RELAXED);
    snprintf(driver_version, sizeof driver_version, "%s", "550.163.01");
    if (log_file) fclose(log_file);
    log_file = NULL;
}

static void config_error(const char *path, int line, const char *format, ...) {
    va_list args;
    va_start(args, format);
    fprintf(stderr, "fake NVML: %s:%d: ", path, line);
    vfprintf(stderr, format, args);
    fputc('\n', stderr);
    va_end(args);
}

static char *next_token(char **cursor) {
    char *p = *cursor;
    while (*p == ' ' || *p == '\t') p++;
    if (*p == '\0') {
        *cursor = p;
        return NULL;
    }
    char *start = p;
    while (*p && *p != ' ' && *p != '\t') p++;
    if (*p) *p++ = '\0';
    *cursor = p;
    return start;
}

static char *rest_of_line(char **cursor) {
    char *p = *cursor;
    while (*p == ' ' || *p == '\t') p++;
    return p;
}

/* Does the next word contain '='? (Looks without cutting the line, so a name that follows stays whole.) */
static int is_option(const char *cursor) {
    while (*cursor == ' ' || *cursor == '\t') cursor++;
    for (; *cursor && *cursor != ' ' && *cursor != '\t'; cursor++)
        if (*cursor == '=') return 1;
    return 0;
}

static int parse_uint(const char *text, unsigned long long max, unsigned long long *out) {
    if (!text || !*text || *text == '-') return 0;
    char *end;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno || *end || value > max) return 0;
    *out = value;
    return 1;
}

/* A process's memory: bytes, or "na" for NVML_VALUE_NOT_AVAILABLE. */
static int parse_used(const char *text, unsigned long long *out) {
    if (text && strcmp(text, "na") == 0) {
        *out = VALUE_NOT_AVAILABLE;
        return 1;
    }
    return parse_uint(text, ~0ull, out);
}

static int parse_kind(const char *text, enum kind *out) {
    if (!text) return 0;
    if (strcmp(text, "compute") == 0) *out = K_COMPUTE;
    else if (strcmp(text, "graphics") == 0) *out = K_GRAPHICS;
    else if (strcmp(text, "mps") == 0) *out = K_MPS;
    else return 0;
    return 1;
}

static void copy_text(char *dst, const char *src) { snprintf(dst, TEXT_LEN, "%s", src ? src : ""); }

static struct device *find_uuid(const char *uuid) {
    for (unsigned int g = 0; g < MAX_GPUS; g++) {
        if (!gpus[g].in_use) continue;
        if (strcmp(gpus[g].uuid, uuid) == 0) return &gpus[g];
        for (unsigned int m = 0; m < MAX_MIG; m++)
            if (migs[g][m].in_use && strcmp(migs[g][m].uuid, uuid) == 0) return &migs[g][m];
    }
    return NULL;
}

/* A "proc" device field: a GPU index, or a GPU or MIG device UUID. */
static struct device *find_device(const char *text) {
    unsigned long long index;
    if (parse_uint(text, MAX_GPUS - 1, &index)) return gpus[index].in_use ? &gpus[index] : NULL;
    return find_uuid(text);
}

static struct device *find_mig(struct device *gpu, unsigned int gi, unsigned int ci) {
    for (unsigned int m = 0; m < MAX_MIG; m++) {
        struct device *mig = gpu->mig[m];
        if (mig && mig->gi == gi && mig->ci == ci) return mig;
    }
    return NULL;
}

static int add_proc_line(struct proc_line **lines, size_t *count, size_t *capacity, struct proc_line line) {
    if (*count == *capacity) {
        size_t grown = *capacity ? *capacity * 2 : 256;
        struct proc_line *more = realloc(*lines, grown * sizeof **lines);
        if (!more) return 0;
        *lines = more;
        *capacity = grown;
    }
    (*lines)[(*count)++] = line;
    return 1;
}

/* Build every device's per-kind process array in two passes (count, then fill): thousands of processes cost
 * one allocation per list, and each query is a memcpy. */
static int build_process_lists(const struct proc_line *lines, size_t count) {
    for (size_t i = 0; i < count; i++) {
        lines[i].gpu->procs[lines[i].kind].count++;
        if (lines[i].mig) lines[i].mig->procs[lines[i].kind].count++;
    }
    for (unsigned int g = 0; g < MAX_GPUS; g++) {
        struct device *all[1 + MAX_MIG] = {&gpus[g]};
        for (unsigned int m = 0; m < MAX_MIG; m++) all[1 + m] = &migs[g][m];
        for (unsigned int d = 0; d < 1 + MAX_MIG; d++)
            for (int k = 0; k < K_COUNT; k++) {
                struct proc_list *list = &all[d]->procs[k];
                if (list->count == 0) continue;
                list->items = calloc(list->count, sizeof *list->items);
                if (!list->items) return 0;
                list->count = 0; /* refilled below */
            }
    }
    for (size_t i = 0; i < count; i++) {
        struct proc_list *list = &lines[i].gpu->procs[lines[i].kind];
        list->items[list->count++] = lines[i].info;
        if (lines[i].mig) {
            list = &lines[i].mig->procs[lines[i].kind];
            list->items[list->count++] = lines[i].info;
        }
    }
    return 1;
}

/* The real driver lists an MPS client in the compute list too, with the same memory (H200, 580.159.04: each client
 * in both nvmlDeviceGetComputeRunningProcesses and nvmlDeviceGetMPSComputeRunningProcesses). An "mps" process on
 * a device without an "mps_server" line stays in the MPS list alone, so that a test can exercise that list alone. */
static int list_mps_clients_as_compute(struct proc_line **lines, size_t *count, size_t *capacity) {
    size_t given = *count;
    for (size_t i = 0; i < given; i++) {
        struct proc_line line = (*lines)[i];
        const struct device *device = line.mig ? line.mig : line.gpu;
        if (line.kind != K_MPS || !device->mps_server) continue;
        line.kind = K_COMPUTE;
        if (!add_proc_line(lines, count, capacity, line)) return 0;
    }
    return 1;
}

/* Parse one line (already split into `keyword` and the rest at `cursor`); 0 on error after reporting it. */
static int parse_line(const char *path, int number, const char *keyword, char *cursor, struct proc_line **procs,
                      size_t *proc_count, size_t *proc_capacity) {
    unsigned long long a, b, c, d, e, f;
    if (strcmp(keyword, "driver") == 0) {
        char *version = next_token(&cursor);
        if (!version) return config_error(path, number, "driver needs a version"), 0;
        copy_text(driver_version, version);
    } else if (strcmp(keyword, "max_slices") == 0) {
        if (!parse_uint(next_token(&cursor), 64, &a) || a == 0)
            return config_error(path, number, "max_slices needs a count from 1 to 64"), 0;
        default_max_slices = (unsigned int)a;
    } else if (strcmp(keyword, "log") == 0) {
        char *file = rest_of_line(&cursor);
        if (log_file) fclose(log_file);
        log_file = fopen(file, "a");
        if (!log_file) return config_error(path, number, "cannot open log %s: %s", file, strerror(errno)), 0;
        setvbuf(log_file, NULL, _IOLBF, 0);
    } else if (strcmp(keyword, "gpu") == 0) {
        char *uuid;
        if (!parse_uint(next_token(&cursor), MAX_GPUS - 1, &a) || !(uuid = next_token(&cursor)) ||
            !parse_uint(next_token(&cursor), 0xFFFFFFFFu, &b) || !parse_uint(next_token(&cursor), ~0ull, &c))
            return config_error(path, number, "expected: gpu <index 0-63> <uuid> <minor> <total_bytes> [mig=0|1] "
                                              "[max_slices=<n>] <name...>"), 0;
        struct device *gpu = &gpus[a];
        if (gpu->in_use) return config_error(path, number, "GPU index %llu defined twice", a), 0;
        gpu->in_use = 1;
        gpu->index = (unsigned int)a;
        gpu->minor = (unsigned int)b;
        gpu->total = c;
        copy_text(gpu->uuid, uuid);
        while (is_option(cursor)) {
            char *option = next_token(&cursor);
            if (strncmp(option, "mig=", 4) == 0 && parse_uint(option + 4, 1, &d)) gpu->mig_enabled = (int)d;
            else if (strncmp(option, "max_slices=", 11) == 0 && parse_uint(option + 11, 64, &d) && d > 0)
                gpu->max_slices = (unsigned int)d;
            else return config_error(path, number, "unknown gpu option %s", option), 0;
        }
        copy_text(gpu->name, rest_of_line(&cursor));
        if (a + 1 > gpu_count) gpu_count = (unsigned int)(a + 1);
    } else if (strcmp(keyword, "mig") == 0) {
        char *uuid;
        if (!parse_uint(next_token(&cursor), MAX_GPUS - 1, &a) || !parse_uint(next_token(&cursor), MAX_MIG - 1, &b) ||
            !(uuid = next_token(&cursor)) || !parse_uint(next_token(&cursor), 0xFFFFFFFEu, &c) ||
            !parse_uint(next_token(&cursor), 0xFFFFFFFEu, &d) || !parse_uint(next_token(&cursor), 64, &e) ||
            !parse_uint(next_token(&cursor), ~0ull, &f))
            return config_error(path, number, "expected: mig <parent_index> <slot 0-7> <uuid> <gi> <ci> <slices> "
                                              "<total_bytes> [<name...>]"), 0;
        if (!gpus[a].in_use) return config_error(path, number, "mig names GPU %llu, defined by no earlier gpu line", a), 0;
        struct device *mig = &migs[a][b];
        if (mig->in_use) return config_error(path, number, "MIG slot %llu of GPU %llu defined twice", b, a), 0;
        mig->in_use = 1;
        mig->is_mig = 1;
        mig->index = (unsigned int)b;
        mig->parent = &gpus[a];
        mig->minor = gpus[a].minor;
        mig->gi = (unsigned int)c;
        mig->ci = (unsigned int)d;
        mig->slices = (unsigned int)e;
        mig->total = f;
        copy_text(mig->uuid, uuid);
        char *name = rest_of_line(&cursor);
        copy_text(mig->name, *name ? name : gpus[a].name);
        gpus[a].mig[b] = mig;
    } else if (strcmp(keyword, "proc") == 0) {
        char *device_text = next_token(&cursor), *kind_text = next_token(&cursor);
        char *pid_text = next_token(&cursor), *used_text = next_token(&cursor);
        struct proc_line line = {0};
        struct device *device = device_text ? find_device(device_text) : NULL;
        if (!device || !parse_kind(kind_text, &line.kind) || !parse_uint(pid_text, 0xFFFFFFFFu, &a) || !used_text)
            return config_error(path, number, "expected: proc <gpu index|uuid> <compute|graphics|mps> <pid> "
                                              "<used_bytes|na> [gi=<n>] [ci=<n>] (devices must come first)"), 0;
        line.info.pid = (unsigned int)a;
        if (!parse_used(used_text, &line.info.usedGpuMemory))
            return config_error(path, number, "used memory must be bytes or na, not %s", used_text), 0;
        line.gpu = device->is_mig ? device->parent : device;
        line.mig = device->is_mig ? device : NULL;
        unsigned int gi = line.mig ? line.mig->gi : NO_INSTANCE, ci = line.mig ? line.mig->ci : NO_INSTANCE;
        for (char *option; (option = next_token(&cursor));) {
            if (strncmp(option, "gi=", 3) == 0 && parse_uint(option + 3, 0xFFFFFFFFu, &c)) gi = (unsigned int)c;
            else if (strncmp(option, "ci=", 3) == 0 && parse_uint(option + 3, 0xFFFFFFFFu, &c)) ci = (unsigned int)c;
            else return config_error(path, number, "unknown proc option %s", option), 0;
        }
        if (!line.mig && line.gpu->mig_enabled) line.mig = find_mig(line.gpu, gi, ci);
        /* nvml.h: the instance ids are 0xFFFFFFFF whenever MIG is not enabled, whatever was asked for. */
        line.info.gpuInstanceId = line.gpu->mig_enabled ? gi : NO_INSTANCE;
        line.info.computeInstanceId = line.gpu->mig_enabled ? ci : NO_INSTANCE;
        if (!line.gpu->mig_enabled) line.mig = NULL;
        if (!add_proc_line(procs, proc_count, proc_capacity, line))
            return config_error(path, number, "out of memory"), 0;
    } else if (strcmp(keyword, "mps_server") == 0) {
        /* nvidia-cuda-mps-server: listed in the compute list with its own memory (real driver: H200, 580.159.04). */
        char *device_text = next_token(&cursor), *pid_text = next_token(&cursor), *used_text = next_token(&cursor);
        struct device *device = device_text ? find_device(device_text) : NULL;
        struct proc_line line = {.kind = K_COMPUTE};
        if (!device || !parse_uint(pid_text, 0xFFFFFFFFu, &a) || !parse_used(used_text, &line.info.usedGpuMemory) ||
            next_token(&cursor))
            return config_error(path, number, "expected: mps_server <gpu index|uuid> <pid> <used_bytes|na> "
                                              "(devices must come first)"), 0;
        if (device->mps_server) return config_error(path, number, "a second MPS server on %s", device->uuid), 0;
        device->mps_server = 1;
        device->mps_server_pid = line.info.pid = (unsigned int)a;
        line.gpu = device->is_mig ? device->parent : device;
        line.mig = device->is_mig ? device : NULL;
        line.info.gpuInstanceId = line.mig ? line.mig->gi : NO_INSTANCE;
        line.info.computeInstanceId = line.mig ? line.mig->ci : NO_INSTANCE;
        if (!add_proc_line(procs, proc_count, proc_capacity, line))
            return config_error(path, number, "out of memory"), 0;
    } else if (strcmp(keyword, "util_period") == 0) {
        if (!parse_uint(next_token(&cursor), 3600000000ull, &a) || a == 0)
            return config_error(path, number, "util_period needs microseconds from 1 to 3600000000"), 0;
        util_period_us = a;
    } else if (strcmp(keyword, "util") == 0) {
        char *device_text = next_token(&cursor);
        struct device *device = device_text ? find_device(device_text) : NULL;
        struct util_sample sample = {0};
        unsigned long long values[5];
        int ok = device != NULL;
        for (int i = 0; ok && i < 5; i++) ok = parse_uint(next_token(&cursor), 0xFFFFFFFFu, &values[i]);
        if (!ok)
            return config_error(path, number, "expected: util <gpu index|uuid> <pid> <sm> <mem> <enc> <dec> "
                                              "[jpg=<n>] [ofa=<n>] [at=<cpu_us>] (devices must come first)"), 0;
        sample.pid = (unsigned int)values[0];
        sample.sm = (unsigned int)values[1];
        sample.mem = (unsigned int)values[2];
        sample.enc = (unsigned int)values[3];
        sample.dec = (unsigned int)values[4];
        for (char *option; (option = next_token(&cursor));) {
            if (strncmp(option, "jpg=", 4) == 0 && parse_uint(option + 4, 0xFFFFFFFFu, &c)) sample.jpg = (unsigned int)c;
            else if (strncmp(option, "ofa=", 4) == 0 && parse_uint(option + 4, 0xFFFFFFFFu, &c))
                sample.ofa = (unsigned int)c;
            else if (strncmp(option, "at=", 3) == 0 && parse_uint(option + 3, ~0ull, &c) && c > 0) sample.at = c;
            else return config_error(path, number, "unknown util option %s", option), 0;
        }
        struct util_list *list = &device->samples;
        if (list->count == list->capacity) {
            unsigned int grown = list->capacity ? list->capacity * 2 : 64;
            struct util_sample *more = realloc(list->items, grown * sizeof *more);
            if (!more) return config_error(path, number, "out of memory"), 0;
            list->items = more;
            list->capacity = grown;
        }
        list->items[list->count++] = sample;
    } else if (strcmp(keyword, "error") == 0) {
        char *function = next_token(&cursor);
        long long code;
        char *code_text = next_token(&cursor), *end = NULL;
        if (code_text) code = strtoll(code_text, &end, 0);
        if (!function || !code_text || *end || function_id(function) < 0 || error_count == MAX_ERRORS)
            return config_error(path, number, "expected: error <known NVML function> <code> [device=<uuid|index>] "
                                              "[times=<n>] (at most %d rules)", MAX_ERRORS), 0;
        struct error_rule *rule = &errors[error_count++];
        memset(rule, 0, sizeof *rule);
        snprintf(rule->function, sizeof rule->function, "%s", function);
        rule->code = (nvmlReturn_t)code;
        rule->times = -1;
        for (char *option; (option = next_token(&cursor));) {
            if (strncmp(option, "device=", 7) == 0) copy_text(rule->device, option + 7);
            else if (strncmp(option, "times=", 6) == 0 && parse_uint(option + 6, 1u << 30, &a)) rule->times = (int)a;
            else return config_error(path, number, "unknown error option %s", option), 0;
        }
    } else {
        return config_error(path, number, "unknown keyword %s", keyword), 0;
    }
    return 1;
}

static nvmlReturn_t load_config(void) {
    clear_state();
    const char *path = getenv("FAKE_NVML_CONFIG");
    if (!path || !*path) {
        fprintf(stderr, "fake NVML: FAKE_NVML_CONFIG is not set; reporting the driver as not loaded\n");
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    FILE *file = fopen(path, "r");
    if (!file) {
        fprintf(stderr, "fake NVML: cannot read %s: %s\n", path, strerror(errno));
        return NVML_ERROR_DRIVER_NOT_LOADED;
    }
    struct proc_line *procs = NULL;
    size_t proc_count = 0, proc_capacity = 0;
    char buffer[1024];
    int number = 0, ok = 1;
    while (ok && fgets(buffer, sizeof buffer, file)) {
        number++;
        buffer[strcspn(buffer, "\r\n")] = '\0';
        char *cursor = buffer;
        char *keyword = next_token(&cursor);
        if (!keyword || keyword[0] == '#') continue;
        ok = parse_line(path, number, keyword, cursor, &procs, &proc_count, &proc_capacity);
    }
    fclose(file);
    for (unsigned int g = 0; ok && g < gpu_count; g++)
        if (!gpus[g].in_use) {
            config_error(path, 0, "GPU indexes must be 0..n-1 without gaps; %u is missing", g);
            ok = 0;
        }
    for (unsigned int g = 0; g < gpu_count; g++)
        if (!gpus[g].max_slices) gpus[g].max_slices = default_max_slices;
    if (ok) ok = list_mps_clients_as_compute(&procs, &proc_count, &proc_capacity);
    if (ok) ok = build_process_lists(procs, proc_count);
    free(procs);
    if (!ok) {
        clear_state();
        return NVML_ERROR_UNKNOWN;
    }
    return NVML_SUCCESS;
}

/* ---- initialisation ---- */

static nvmlReturn_t init(int f) {
    pthread_mutex_lock(&lock);
    nvmlReturn_t code = NVML_SUCCESS;
    if (refcount == 0) code = load_config();
    pthread_mutex_unlock(&lock);
    if (code == NVML_SUCCESS) code = injected(f, NULL, -1);
    pthread_mutex_lock(&lock);
    if (code == NVML_SUCCESS) refcount++;
    else if (refcount == 0) clear_state();
    pthread_mutex_unlock(&lock);
    return finish(f, code);
}

nvmlReturn_t nvmlInit_v2(void) { return init(F_INIT_V2); }

nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    (void)flags;
    return init(F_INIT_FLAGS);
}

nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&lock);
    if (refcount == 0) {
        pthread_mutex_unlock(&lock);
        return finish(F_SHUTDOWN, NVML_ERROR_UNINITIALIZED);
    }
    int last = --refcount == 0;
    finish(F_SHUTDOWN, NVML_SUCCESS); /* before clear_state closes the log, so the shutdown is logged */
    if (last) clear_state();
    pthread_mutex_unlock(&lock);
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t code) {
    switch (code) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t copy_string(char *out, unsigned int length, const char *value) {
    if (!out) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(value) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, value, strlen(value) + 1);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (refcount == 0) return finish(F_DRIVER_VERSION, NVML_ERROR_UNINITIALIZED);
    nvmlReturn_t code = injected(F_DRIVER_VERSION, NULL, -1);
    return finish(F_DRIVER_VERSION, code ? code : copy_string(version, length, driver_version));
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    if (refcount == 0) return finish(F_NVML_VERSION, NVML_ERROR_UNINITIALIZED);
    return finish(F_NVML_VERSION, copy_string(version, length, "12.550.163.01"));
}

/* ---- devices ---- */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (refcount == 0) return finish(F_COUNT, NVML_ERROR_UNINITIALIZED);
    nvmlReturn_t code = injected(F_COUNT, NULL, -1);
    if (code) return finish(F_COUNT, code);
    if (!count) return finish(F_COUNT, NVML_ERROR_INVALID_ARGUMENT);
    *count = gpu_count;
    return finish(F_COUNT, NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (refcount == 0) return finish(F_HANDLE_BY_INDEX, NVML_ERROR_UNINITIALIZED);
    if (!device || index >= gpu_count) return finish(F_HANDLE_BY_INDEX, NVML_ERROR_INVALID_ARGUMENT);
    nvmlReturn_t code = injected(F_HANDLE_BY_INDEX, &gpus[index], index);
    if (code) return finish(F_HANDLE_BY_INDEX, code);
    *device = &gpus[index];
    return finish(F_HANDLE_BY_INDEX, NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    if (refcount == 0) return finish(F_HANDLE_BY_UUID, NVML_ERROR_UNINITIALIZED);
    if (!uuid || !device) return finish(F_HANDLE_BY_UUID, NVML_ERROR_INVALID_ARGUMENT);
    struct device *found = find_uuid(uuid);
    if (!found) return finish(F_HANDLE_BY_UUID, NVML_ERROR_NOT_FOUND);
    nvmlReturn_t code = injected(F_HANDLE_BY_UUID, found, -1);
    if (code) return finish(F_HANDLE_BY_UUID, code);
    *device = found;
    return finish(F_HANDLE_BY_UUID, NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t d, char *uuid, unsigned int length) {
    BEGIN(F_UUID, d);
    return finish(F_UUID, copy_string(uuid, length, d->uuid));
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t d, char *name, unsigned int length) {
    BEGIN(F_NAME, d);
    return finish(F_NAME, copy_string(name, length, d->name));
}

nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t d, unsigned int *minor) {
    BEGIN(F_MINOR, d);
    if (!minor) return finish(F_MINOR, NVML_ERROR_INVALID_ARGUMENT);
    *minor = d->minor;
    return finish(F_MINOR, NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t d, unsigned int *index) {
    BEGIN(F_INDEX, d);
    if (!index) return finish(F_INDEX, NVML_ERROR_INVALID_ARGUMENT);
    *index = d->is_mig ? d->parent->index : d->index;
    return finish(F_INDEX, NVML_SUCCESS);
}

/* Used memory = the sum of the device's compute processes, so free + used = total as on a real card. */
static unsigned long long used_memory(const struct device *d) {
    unsigned long long used = 0;
    const struct proc_list *list = &d->procs[K_COMPUTE];
    for (unsigned int i = 0; i < list->count; i++)
        if (list->items[i].usedGpuMemory != VALUE_NOT_AVAILABLE) used += list->items[i].usedGpuMemory;
    return used > d->total ? d->total : used;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t d, nvmlMemory_t *memory) {
    BEGIN(F_MEMORY, d);
    if (!memory) return finish(F_MEMORY, NVML_ERROR_INVALID_ARGUMENT);
    memory->total = d->total;
    memory->used = used_memory(d);
    memory->free = d->total - memory->used;
    return finish(F_MEMORY, NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *memory) {
    BEGIN(F_MEMORY_V2, d);
    if (!memory) return finish(F_MEMORY_V2, NVML_ERROR_INVALID_ARGUMENT);
    if (memory->version != nvmlMemory_v2) return finish(F_MEMORY_V2, NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    memory->total = d->total;
    memory->reserved = 0;
    memory->used = used_memory(d);
    memory->free = d->total - memory->used;
    return finish(F_MEMORY_V2, NVML_SUCCESS);
}

/* ---- MIG ---- */

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending) {
    BEGIN(F_MIG_MODE, d);
    if (!current || !pending) return finish(F_MIG_MODE, NVML_ERROR_INVALID_ARGUMENT);
    if (d->is_mig) return finish(F_MIG_MODE, NVML_ERROR_NOT_SUPPORTED);
    *current = *pending = (unsigned int)d->mig_enabled;
    return finish(F_MIG_MODE, NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t d, unsigned int *count) {
    BEGIN(F_MAX_MIG, d);
    if (!count) return finish(F_MAX_MIG, NVML_ERROR_INVALID_ARGUMENT);
    if (d->is_mig) return finish(F_MAX_MIG, NVML_ERROR_NOT_SUPPORTED);
    *count = d->max_slices < MAX_MIG ? d->max_slices : MAX_MIG;
    return finish(F_MAX_MIG, NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t d, unsigned int index, nvmlDevice_t *mig) {
    BEGIN(F_MIG_HANDLE, d);
    if (!mig || d->is_mig || index >= MAX_MIG) return finish(F_MIG_HANDLE, NVML_ERROR_INVALID_ARGUMENT);
    if (!d->mig_enabled || !d->mig[index]) return finish(F_MIG_HANDLE, NVML_ERROR_NOT_FOUND);
    *mig = d->mig[index];
    return finish(F_MIG_HANDLE, NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t d, unsigned int *id) {
    BEGIN(F_GI, d);
    if (!id) return finish(F_GI, NVML_ERROR_INVALID_ARGUMENT);
    if (!d->is_mig) return finish(F_GI, NVML_ERROR_NOT_SUPPORTED);
    *id = d->gi;
    return finish(F_GI, NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t d, unsigned int *id) {
    BEGIN(F_CI, d);
    if (!id) return finish(F_CI, NVML_ERROR_INVALID_ARGUMENT);
    if (!d->is_mig) return finish(F_CI, NVML_ERROR_NOT_SUPPORTED);
    *id = d->ci;
    return finish(F_CI, NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t d, nvmlDevice_t *parent) {
    BEGIN(F_PARENT, d);
    if (!parent || !d->is_mig) return finish(F_PARENT, NVML_ERROR_INVALID_ARGUMENT);
    *parent = d->parent;
    return finish(F_PARENT, NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t d, unsigned int *is_mig) {
    BEGIN(F_IS_MIG, d);
    if (!is_mig) return finish(F_IS_MIG, NVML_ERROR_INVALID_ARGUMENT);
    *is_mig = (unsigned int)d->is_mig;
    return finish(F_IS_MIG, NVML_SUCCESS);
}

/* nvml.h: "This API currently only supports MIG device handles." */
nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t d, nvmlDeviceAttributes_t *attributes) {
    BEGIN(F_ATTRIBUTES, d);
    if (!attributes) return finish(F_ATTRIBUTES, NVML_ERROR_INVALID_ARGUMENT);
    if (!d->is_mig) return finish(F_ATTRIBUTES, NVML_ERROR_NOT_SUPPORTED);
    memset(attributes, 0, sizeof *attributes);
    attributes->multiprocessorCount = 16 * d->slices;
    attributes->gpuInstanceSliceCount = d->slices;
    attributes->computeInstanceSliceCount = d->slices;
    attributes->memorySizeMB = d->total >> 20;
    return finish(F_ATTRIBUTES, NVML_SUCCESS);
}

nvmlReturn_t nvmlDeviceGetAttributes(nvmlDevice_t d, nvmlDeviceAttributes_t *attributes) {
    return nvmlDeviceGetAttributes_v2(d, attributes);
}

/* Slice counts of the GPU-instance profiles NVML_GPU_INSTANCE_PROFILE_1_SLICE (0) .. _3_SLICE_GFX (0x11). */
static const unsigned int profile_slices[] = {1, 2, 3, 4, 7, 8, 6, 1, 2, 1, 1, 2, 4, 1, 2, 1, 2, 3};

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(nvmlDevice_t d, unsigned int profile,
                                                  nvmlGpuInstanceProfileInfo_v2_t *info) {
    BEGIN(F_PROFILE, d);
    if (!info || d->is_mig) return finish(F_PROFILE, NVML_ERROR_INVALID_ARGUMENT);
    if (info->version != nvmlGpuInstanceProfileInfo_v2) return finish(F_PROFILE, NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    if (profile >= sizeof profile_slices / sizeof profile_slices[0]) return finish(F_PROFILE, NVML_ERROR_INVALID_ARGUMENT);
    unsigned int slices = profile_slices[profile];
    /* A card offers the small profiles and exactly one whole-card profile (7, 8 or 6 slices). */
    int whole_card = profile >= 4 && profile <= 6;
    if (!d->mig_enabled || slices > d->max_slices || (whole_card && slices != d->max_slices))
        return finish(F_PROFILE, NVML_ERROR_NOT_SUPPORTED);
    unsigned int version = info->version;
    memset(info, 0, sizeof *info);
    info->version = version;
    info->id = profile;
    info->sliceCount = slices;
    info->instanceCount = d->max_slices / slices;
    info->multiprocessorCount = 16 * slices;
    info->memorySizeMB = (d->total >> 20) * slices / d->max_slices;
    snprintf(info->name, sizeof info->name, "MIG %ug.%llugb", slices, (info->memorySizeMB + 512) >> 10);
    return finish(F_PROFILE, NVML_SUCCESS);
}

/* ---- processes: nvml.h's size protocol ---- */

/* "If infoCount is too small (or infos is NULL and processes exist): NVML_ERROR_INSUFFICIENT_SIZE with the
 * needed count in *infoCount. With no processes: NVML_SUCCESS and *infoCount = 0." pynvml's first call passes
 * a count of 0 and NULL, then retries with an array of 2n+5. */
static nvmlReturn_t list_processes(int f, nvmlDevice_t d, enum kind kind, unsigned int *count, nvmlProcessInfo_t *infos) {
    BEGIN(f, d);
    if (!count) return finish(f, NVML_ERROR_INVALID_ARGUMENT);
    const struct proc_list *list = &d->procs[kind];
    if (list->count == 0) {
        *count = 0;
        return finish(f, NVML_SUCCESS);
    }
    if (!infos || *count < list->count) {
        *count = list->count;
        return finish(f, NVML_ERROR_INSUFFICIENT_SIZE);
    }
    memcpy(infos, list->items, list->count * sizeof *infos);
    *count = list->count;
    return finish(f, NVML_SUCCESS);
}

#define PROCESS_CALL(symbol, f, kind)                                                                            \
    nvmlReturn_t symbol(nvmlDevice_t d, unsigned int *count, nvmlProcessInfo_t *infos) {                          \
        return list_processes(f, d, kind, count, infos);                                                         \
    }

PROCESS_CALL(nvmlDeviceGetComputeRunningProcesses_v3, F_COMPUTE_V3, K_COMPUTE)
PROCESS_CALL(nvmlDeviceGetComputeRunningProcesses_v2, F_COMPUTE_V2, K_COMPUTE)
PROCESS_CALL(nvmlDeviceGetGraphicsRunningProcesses_v3, F_GRAPHICS_V3, K_GRAPHICS)
PROCESS_CALL(nvmlDeviceGetGraphicsRunningProcesses_v2, F_GRAPHICS_V2, K_GRAPHICS)
PROCESS_CALL(nvmlDeviceGetMPSComputeRunningProcesses_v3, F_MPS_V3, K_MPS)
PROCESS_CALL(nvmlDeviceGetMPSComputeRunningProcesses_v2, F_MPS_V2, K_MPS)

/* ---- per-process utilisation: nvml.h's lastSeenTimeStamp and size protocol ---- */

void fakeNvmlSetClock(unsigned long long us) { __atomic_store_n(&fixed_now_us, us, __ATOMIC_RELAXED); }

static unsigned long long now_us(void) {
    unsigned long long fixed = __atomic_load_n(&fixed_now_us, __ATOMIC_RELAXED);
    if (fixed) return fixed;
    struct timeval now;
    gettimeofday(&now, NULL);
    return (unsigned long long)now.tv_sec * 1000000ull + (unsigned long long)now.tv_usec;
}

static unsigned long long sample_time(const struct util_sample *sample, unsigned long long now) {
    return sample->at ? sample->at : now - now % util_period_us;
}

/* nvml.h: "On MIG-enabled GPUs, querying process utilization is not currently supported." */
static int utilisation_supported(const struct device *d) { return !d->is_mig && !d->mig_enabled; }

static int is_mps_client(const struct device *d, unsigned int pid) {
    const struct proc_list *clients = &d->procs[K_MPS];
    for (unsigned int i = 0; i < clients->count; i++)
        if (clients->items[i].pid == pid) return 1;
    return 0;
}

static unsigned int add_capped(unsigned int a, unsigned int b) { return a + b > 100 ? 100 : a + b; }

/* The samples newer than `last_seen` a query returns, into `out` (room for every sample of the device), each with
 * its timestamp in `at`; `*newest` is raised to the newest timestamp. Under MPS the driver samples only the server,
 * which runs its clients' kernels (H200, 580.159.04: samples for the server's pid alone while the clients are
 * busy): a client's sample is the server's, and samples that then share a pid and a timestamp are one, their
 * values added (at most 100). */
static unsigned int gather_samples(const struct device *d, unsigned long long last_seen, unsigned long long now,
                                   struct util_sample *out, unsigned long long *newest) {
    unsigned int found = 0;
    for (unsigned int i = 0; i < d->samples.count; i++) {
        struct util_sample sample = d->samples.items[i];
        sample.at = sample_time(&sample, now);
        if (sample.at <= last_seen) continue;
        if (sample.at > *newest) *newest = sample.at;
        if (d->mps_server && is_mps_client(d, sample.pid)) sample.pid = d->mps_server_pid;
        unsigned int j = 0;
        while (j < found && !(out[j].pid == sample.pid && out[j].at == sample.at)) j++;
        if (j == found) {
            out[found++] = sample;
            continue;
        }
        out[j].sm = add_capped(out[j].sm, sample.sm);
        out[j].mem = add_capped(out[j].mem, sample.mem);
        out[j].enc = add_capped(out[j].enc, sample.enc);
        out[j].dec = add_capped(out[j].dec, sample.dec);
        out[j].jpg = add_capped(out[j].jpg, sample.jpg);
        out[j].ofa = add_capped(out[j].ofa, sample.ofa);
    }
    return found;
}

/* One utilisation query's samples, newer than `last_seen`, into `*samples` (the caller frees it), their number in
 * `*found`, and what NVML answers: "If no valid sample entries are found since the lastSeenTimeStamp,
 * NVML_ERROR_NOT_FOUND is returned"; a NULL buffer or one with less `room` than needed answers INSUFFICIENT_SIZE
 * (the caller then writes nothing but the count). */
static nvmlReturn_t query_samples(const struct device *d, unsigned long long last_seen, int buffer, unsigned int room,
                                  struct util_sample **samples, unsigned int *found, unsigned long long *newest) {
    *found = 0;
    *samples = calloc(d->samples.count + 1, sizeof **samples);
    if (!*samples) return NVML_ERROR_UNKNOWN;
    *found = gather_samples(d, last_seen, now_us(), *samples, newest);
    if (*found == 0) return NVML_ERROR_NOT_FOUND;
    if (!buffer || room < *found) return NVML_ERROR_INSUFFICIENT_SIZE;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t d, nvmlProcessUtilizationSample_t *utilization,
                                             unsigned int *processSamplesCount, unsigned long long lastSeenTimeStamp) {
    BEGIN(F_PROCESS_UTIL, d);
    if (!processSamplesCount) return finish(F_PROCESS_UTIL, NVML_ERROR_INVALID_ARGUMENT);
    if (!utilisation_supported(d)) return finish(F_PROCESS_UTIL, NVML_ERROR_NOT_SUPPORTED);
    struct util_sample *samples;
    unsigned int found;
    unsigned long long newest = 0;
    nvmlReturn_t code = query_samples(d, lastSeenTimeStamp, utilization != NULL, *processSamplesCount, &samples,
                                      &found, &newest);
    for (unsigned int i = 0; code == NVML_SUCCESS && i < found; i++) {
        nvmlProcessUtilizationSample_t *out = &utilization[i];
        out->pid = samples[i].pid;
        out->timeStamp = samples[i].at;
        out->smUtil = samples[i].sm;
        out->memUtil = samples[i].mem;
        out->encUtil = samples[i].enc;
        out->decUtil = samples[i].dec;
    }
    free(samples);
    *processSamplesCount = found;
    return finish(F_PROCESS_UTIL, code);
}

/* The versioned call: the same samples, the size protocol through processSamplesCount, and lastSeenTimeStamp
 * advanced to the newest sample written (nvml.h: "a timeStamp retrieved from a previous query"). */
nvmlReturn_t nvmlDeviceGetProcessesUtilizationInfo(nvmlDevice_t d, nvmlProcessesUtilizationInfo_v1_t *info) {
    BEGIN(F_PROCESSES_UTIL_INFO, d);
    if (!info) return finish(F_PROCESSES_UTIL_INFO, NVML_ERROR_INVALID_ARGUMENT);
    if (info->version != nvmlProcessesUtilizationInfo_v1)
        return finish(F_PROCESSES_UTIL_INFO, NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    if (!utilisation_supported(d)) return finish(F_PROCESSES_UTIL_INFO, NVML_ERROR_NOT_SUPPORTED);
    struct util_sample *samples;
    unsigned int found;
    unsigned long long newest = 0;
    nvmlReturn_t code = query_samples(d, info->lastSeenTimeStamp, info->procUtilArray != NULL,
                                      info->processSamplesCount, &samples, &found, &newest);
    for (unsigned int i = 0; code == NVML_SUCCESS && i < found; i++) {
        nvmlProcessUtilizationInfo_v1_t *out = &info->procUtilArray[i];
        out->timeStamp = samples[i].at;
        out->pid = samples[i].pid;
        out->smUtil = samples[i].sm;
        out->memUtil = samples[i].mem;
        out->encUtil = samples[i].enc;
        out->decUtil = samples[i].dec;
        out->jpgUtil = samples[i].jpg;
        out->ofaUtil = samples[i].ofa;
    }
    if (code == NVML_SUCCESS) info->lastSeenTimeStamp = newest;
    free(samples);
    info->processSamplesCount = found;
    return finish(F_PROCESSES_UTIL_INFO, code);
}
