/* A stand-in for the HIP runtime (SONAME libamdhip64.so.7) that runs FlyDSL's kernel launches
 * in aiter's CPU emulator: loaded before FlyDSL's runtime library, it satisfies that library's
 * dependency on HIP. Module loads keep the code object, a launch hands it to the Python callback
 * registered by aiter.flydsl_bridge.emulation; memory is host memory, streams and events are
 * no-ops. Plain C, no torch: it must build and load on a machine without ROCm.
 */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef int hipError_t;

enum {
    HIP_SUCCESS = 0,
    HIP_ERROR_INVALID_VALUE = 1,
    HIP_ERROR_OUT_OF_MEMORY = 2,
    HIP_ERROR_NOT_INITIALIZED = 3,
    HIP_ERROR_INVALID_IMAGE = 200,
    HIP_ERROR_LAUNCH_FAILURE = 719,
};

/* hipModuleLaunchKernel's `extra` keys (hip_runtime_api.h). */
#define HIP_LAUNCH_PARAM_BUFFER_POINTER ((void *)0x01)
#define HIP_LAUNCH_PARAM_BUFFER_SIZE ((void *)0x02)
#define HIP_LAUNCH_PARAM_END ((void *)0x03)

typedef struct {
    unsigned char *image;
    size_t size;
} emu_module;

typedef struct {
    emu_module *module;
    char name[];
} emu_function;

/* image, image bytes, kernel name, grid (blocks) xyz, block xyz, dynamic LDS bytes, stream,
 * kernelParams, kernarg buffer (from `extra`, else NULL), its size. Returns a hipError_t. */
typedef int (*aiter_emu_launch_fn)(const void *, size_t, const char *, unsigned, unsigned,
                                   unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                                   void **, const void *, size_t);

static aiter_emu_launch_fn launch_callback;
static int stream_token, event_token;
static int current_device;

typedef struct {
    void *ptr;
    size_t size;
} emu_allocation;

static emu_allocation *allocations;
static size_t allocation_count, allocation_capacity;

/* --- the face aiter talks to ------------------------------------------------------------------ */

void aiter_emu_set_launch_callback(aiter_emu_launch_fn callback) { launch_callback = callback; }

/* The stream handle hipStreamCreate hands out: lets aiter check FlyDSL's runtime reached us. */
void *aiter_emu_stream_token(void) { return &stream_token; }

/* Copies up to `capacity` live hipMalloc blocks into ptrs/sizes; returns how many there are. */
size_t aiter_emu_allocations(void **ptrs, size_t *sizes, size_t capacity) {
    for (size_t i = 0; i < allocation_count && i < capacity; i++) {
        ptrs[i] = allocations[i].ptr;
        sizes[i] = allocations[i].size;
    }
    return allocation_count;
}

/* --- modules and launches ------------------------------------------------------------------ */

/* An ELF64 image's size: its section header table comes last (e_shoff + e_shnum * e_shentsize),
 * or its program headers and their segments, whichever ends later. */
static size_t elf_size(const unsigned char *image) {
    if (memcmp(image, "\x7f" "ELF", 4) != 0 || image[4] != 2) return 0;
    uint64_t phoff, shoff, end;
    uint16_t phentsize, phnum, shentsize, shnum;
    memcpy(&phoff, image + 0x20, 8);
    memcpy(&shoff, image + 0x28, 8);
    memcpy(&phentsize, image + 0x36, 2);
    memcpy(&phnum, image + 0x38, 2);
    memcpy(&shentsize, image + 0x3a, 2);
    memcpy(&shnum, image + 0x3c, 2);
    end = shoff + (uint64_t)shnum * shentsize;
    if (phoff + (uint64_t)phnum * phentsize > end) end = phoff + (uint64_t)phnum * phentsize;
    for (uint16_t i = 0; i < phnum; i++) {
        uint64_t offset, filesz;
        memcpy(&offset, image + phoff + (uint64_t)i * phentsize + 0x08, 8);
        memcpy(&filesz, image + phoff + (uint64_t)i * phentsize + 0x20, 8);
        if (offset + filesz > end) end = offset + filesz;
    }
    return (size_t)end;
}

hipError_t hipModuleLoadData(void **module, const void *image) {
    if (!module || !image) return HIP_ERROR_INVALID_VALUE;
    size_t size = elf_size(image);
    if (!size) return HIP_ERROR_INVALID_IMAGE;
    emu_module *m = malloc(sizeof *m);
    if (!m) return HIP_ERROR_OUT_OF_MEMORY;
    /* A copy: the caller's buffer belongs to the JIT engine's constants. */
    m->image = malloc(size);
    if (!m->image) {
        free(m);
        return HIP_ERROR_OUT_OF_MEMORY;
    }
    memcpy(m->image, image, size);
    m->size = size;
    *module = m;
    return HIP_SUCCESS;
}

hipError_t hipModuleUnload(void *module) {
    emu_module *m = module;
    if (m) {
        free(m->image);
        free(m);
    }
    return HIP_SUCCESS;
}

hipError_t hipModuleGetFunction(void **function, void *module, const char *name) {
    if (!function || !module || !name) return HIP_ERROR_INVALID_VALUE;
    size_t n = strlen(name) + 1;
    emu_function *f = malloc(sizeof *f + n);
    if (!f) return HIP_ERROR_OUT_OF_MEMORY;
    f->module = module;
    memcpy(f->name, name, n);
    *function = f;
    return HIP_SUCCESS;
}

hipError_t hipModuleLaunchKernel(void *function, unsigned gx, unsigned gy, unsigned gz,
                                 unsigned bx, unsigned by, unsigned bz, unsigned shared,
                                 void *stream, void **params, void **extra) {
    emu_function *f = function;
    if (!f) return HIP_ERROR_INVALID_VALUE;
    if (!launch_callback) return HIP_ERROR_NOT_INITIALIZED;
    const void *buffer = NULL;
    size_t buffer_size = 0;
    for (void **e = extra; e && *e != HIP_LAUNCH_PARAM_END; e += 2) {
        if (e[0] == HIP_LAUNCH_PARAM_BUFFER_POINTER) buffer = e[1];
        else if (e[0] == HIP_LAUNCH_PARAM_BUFFER_SIZE) buffer_size = *(size_t *)e[1];
        else return HIP_ERROR_INVALID_VALUE;
    }
    return launch_callback(f->module->image, f->module->size, f->name, gx, gy, gz, bx, by, bz,
                           shared, stream, params, buffer, buffer_size);
}

hipError_t hipModuleOccupancyMaxActiveBlocksPerMultiprocessor(int *blocks, void *function,
                                                              int block_size, size_t shared) {
    (void)function, (void)shared;
    if (!blocks || block_size <= 0) return HIP_ERROR_INVALID_VALUE;
    /* No occupancy model: the hardware's limit of 2048 work-items per CU. */
    *blocks = block_size >= 2048 ? 1 : 2048 / block_size;
    return HIP_SUCCESS;
}

/* --- memory: the host's ------------------------------------------------------------------- */

hipError_t hipMalloc(void **ptr, size_t size) {
    if (!ptr) return HIP_ERROR_INVALID_VALUE;
    if (allocation_count == allocation_capacity) {
        size_t capacity = allocation_capacity ? 2 * allocation_capacity : 16;
        emu_allocation *grown = realloc(allocations, capacity * sizeof *grown);
        if (!grown) return HIP_ERROR_OUT_OF_MEMORY;
        allocations = grown;
        allocation_capacity = capacity;
    }
    /* 256-byte aligned and zeroed, like fresh device memory a kernel may assume aligned. */
    size_t rounded = (size ? size + 255 : 256) / 256 * 256;
    void *p = aligned_alloc(256, rounded);
    if (!p) return HIP_ERROR_OUT_OF_MEMORY;
    memset(p, 0, rounded);
    allocations[allocation_count++] = (emu_allocation){p, rounded};
    *ptr = p;
    return HIP_SUCCESS;
}

hipError_t hipFree(void *ptr) {
    for (size_t i = 0; i < allocation_count; i++) {
        if (allocations[i].ptr == ptr) {
            allocations[i] = allocations[--allocation_count];
            free(ptr);
            return HIP_SUCCESS;
        }
    }
    return ptr ? HIP_ERROR_INVALID_VALUE : HIP_SUCCESS;
}

hipError_t hipMemcpy(void *dst, const void *src, size_t size, int kind) {
    (void)kind;
    memmove(dst, src, size);
    return HIP_SUCCESS;
}

hipError_t hipMemcpyAsync(void *dst, const void *src, size_t size, int kind, void *stream) {
    (void)stream;
    return hipMemcpy(dst, src, size, kind);
}

hipError_t hipMemset(void *dst, int value, size_t size) {
    memset(dst, value, size);
    return HIP_SUCCESS;
}

hipError_t hipMemsetD16Async(void *dst, unsigned short value, size_t count, void *stream) {
    (void)stream;
    unsigned short *p = dst;
    for (size_t i = 0; i < count; i++) p[i] = value;
    return HIP_SUCCESS;
}

hipError_t hipMemsetD32Async(void *dst, int value, size_t count, void *stream) {
    (void)stream;
    int *p = dst;
    for (size_t i = 0; i < count; i++) p[i] = value;
    return HIP_SUCCESS;
}

hipError_t hipHostRegister(void *ptr, size_t size, unsigned flags) {
    (void)ptr, (void)size, (void)flags;
    return HIP_SUCCESS;
}

hipError_t hipHostUnregister(void *ptr) {
    (void)ptr;
    return HIP_SUCCESS;
}

hipError_t hipHostGetDevicePointer(void **device_ptr, void *host_ptr, unsigned flags) {
    (void)flags;
    if (!device_ptr) return HIP_ERROR_INVALID_VALUE;
    *device_ptr = host_ptr; /* one address space: the emulator's memory is the host's */
    return HIP_SUCCESS;
}

/* --- devices, streams, events: launches finish before they return -------------------------- */

hipError_t hipGetDevice(int *device) {
    if (!device) return HIP_ERROR_INVALID_VALUE;
    *device = current_device;
    return HIP_SUCCESS;
}

hipError_t hipSetDevice(int device) {
    if (device != 0) return HIP_ERROR_INVALID_VALUE;
    current_device = device;
    return HIP_SUCCESS;
}

hipError_t hipDeviceSynchronize(void) { return HIP_SUCCESS; }

hipError_t hipGetLastError(void) { return HIP_SUCCESS; }

const char *hipGetErrorName(hipError_t error) {
    switch (error) {
    case HIP_SUCCESS: return "hipSuccess";
    case HIP_ERROR_INVALID_VALUE: return "hipErrorInvalidValue";
    case HIP_ERROR_OUT_OF_MEMORY: return "hipErrorOutOfMemory";
    case HIP_ERROR_NOT_INITIALIZED:
        return "hipErrorNotInitialized (aiter's emulated HIP: launch inside aiter.emulated(arch))";
    case HIP_ERROR_INVALID_IMAGE: return "hipErrorInvalidImage";
    case HIP_ERROR_LAUNCH_FAILURE: return "hipErrorLaunchFailure (aiter's emulator raised)";
    default: return "hipErrorUnknown";
    }
}

hipError_t hipStreamCreate(void **stream) {
    if (!stream) return HIP_ERROR_INVALID_VALUE;
    *stream = &stream_token;
    return HIP_SUCCESS;
}

hipError_t hipStreamDestroy(void *stream) {
    (void)stream;
    return HIP_SUCCESS;
}

hipError_t hipStreamSynchronize(void *stream) {
    (void)stream;
    return HIP_SUCCESS;
}

hipError_t hipStreamWaitEvent(void *stream, void *event, unsigned flags) {
    (void)stream, (void)event, (void)flags;
    return HIP_SUCCESS;
}

hipError_t hipEventCreateWithFlags(void **event, unsigned flags) {
    (void)flags;
    if (!event) return HIP_ERROR_INVALID_VALUE;
    *event = &event_token;
    return HIP_SUCCESS;
}

hipError_t hipEventDestroy(void *event) {
    (void)event;
    return HIP_SUCCESS;
}

hipError_t hipEventRecord(void *event, void *stream) {
    (void)event, (void)stream;
    return HIP_SUCCESS;
}

hipError_t hipEventSynchronize(void *event) {
    (void)event;
    return HIP_SUCCESS;
}
