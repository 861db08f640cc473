/* test_cudasim.c - the CUDA-on-CPU emulator's own tests: every check it
 * makes must catch a seeded bug (tests/cudasim/bugs.cu) and name it
 * (kernel, block, thread, source line), while the correct twin runs
 * clean; the dialect's arithmetic against oracles nobody here wrote (the
 * CPU's F16C and AVX512-BF16 conversions where present, float64
 * references, the nearest-value property); and the runtime's semantics
 * (lazy streams, capture rules, graphs replaying pinned memory, cuBLAS,
 * NCCL, host access to device memory). */
#include <math.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "cublas_v2.h"
#include "cuda_runtime.h"
#include "cusim.h"
#include "nccl.h"

cudaError_t bug_rotate(const float *in, float *out, int n, int barrier);
cudaError_t bug_stride(float *out, int n, int stride);
cudaError_t bug_warp_sum(const float *in, float *out, unsigned mask);
cudaError_t bug_divergent(float *out, int n, int upto);
cudaError_t bug_uninit(float *out, int written);
cudaError_t bug_shared_oob(float *out, int off);
cudaError_t bug_deadlock(float *out);
cudaError_t bug_mma(const uint16_t *A, const uint16_t *B, const float *C, float *D, int off);
cudaError_t bug_vec(const float *in, float *out, int off);
cudaError_t bug_count(int *counter, unsigned blocks, unsigned threads);
cudaError_t bug_inc(const float *in, float *out, int n, cudaStream_t s);
cudaError_t bug_config(unsigned gx, unsigned bx, size_t smem);
cudaError_t bug_allow_smem(int bytes);
uint16_t bug_f2h(float f);
float bug_h2f(uint16_t h);
uint16_t bug_f2bf(float f);
float bug_expf(float x);
float bug_powf(float x, float y);
float bug_logf(float x);
void bug_sincosf(float x, float *s, float *c);

static uint64_t rng = 88172645463325252ull;
static uint32_t next32(void)
{
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}

static float *dev_floats(const float *h, size_t n)
{
    float *d = NULL;
    assert_int_equal(cudaMalloc((void **)&d, n * sizeof *d), cudaSuccess);
    if (h)
        assert_int_equal(cudaMemcpy(d, h, n * sizeof *d, cudaMemcpyHostToDevice), cudaSuccess);
    return d;
}

static void host_floats(float *h, const float *d, size_t n)
{
    assert_int_equal(cudaMemcpy(h, d, n * sizeof *h, cudaMemcpyDeviceToHost), cudaSuccess);
}

/* The synchronisation after a seeded bug fails with e, and the report
 * says every piece of `want` (NULL-terminated). */
static void expect_fault(cudaError_t e, ...)
{
    cudaError_t got = cudaDeviceSynchronize();
    const char *rep = cusim_last_report();
    if (got != e)
        fail_msg("sync gave %s, want %s; report: %s", cudaGetErrorName(got), cudaGetErrorName(e), rep);
    va_list ap;
    va_start(ap, e);
    for (const char *w = va_arg(ap, const char *); w; w = va_arg(ap, const char *))
        if (!strstr(rep, w))
            fail_msg("the report lacks \"%s\":\n%s", w, rep);
    va_end(ap);
    assert_int_equal(cudaGetLastError(), e); /* sticky */
    cudaDeviceReset();
    assert_int_equal(cudaGetLastError(), cudaSuccess);
}

static int setup(void **st)
{
    (void)st;
    cudaDeviceReset();
    return cudaSetDevice(0) == cudaSuccess ? 0 : -1;
}

/* ---- the checks catch their bug ------------------------------------------------------ */

static void test_missing_barrier_is_a_race(void **st)
{
    (void)st;
    float in[64], out[64];
    for (int i = 0; i < 64; i++) in[i] = (float)i;
    float *din = dev_floats(in, 64), *dout = dev_floats(NULL, 64);
    assert_int_equal(bug_rotate(din, dout, 64, 1), cudaSuccess);
    host_floats(out, dout, 64);
    for (int i = 0; i < 64; i++) assert_true(out[i] == (float)((i + 1) % 64));
    assert_int_equal(bug_rotate(din, dout, 64, 0), cudaSuccess);
    expect_fault(cudaErrorLaunchFailure, "kernel rotate_kernel", "shared-memory race", "block (0,0,0)", "thread (",
                 "bugs.cu:", "rotate_kernel(float const*, float*, int)::s", NULL);
}

static void test_wrong_stride_is_out_of_bounds(void **st)
{
    (void)st;
    float *d = dev_floats(NULL, 64);
    assert_int_equal(bug_stride(d, 64, 1), cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(bug_stride(d, 64, 2), cudaSuccess);
    /* thread 32 is the first to write past the 64 floats */
    expect_fault(cudaErrorIllegalAddress, "kernel stride_kernel", "thread (32,0,0)", "past the end of a 256-byte",
                 "bugs.cu:", NULL);
}

static void test_shuffle_mask_names_missing_lanes(void **st)
{
    (void)st;
    float in[32], out[32];
    for (int i = 0; i < 32; i++) in[i] = (float)i;
    float *din = dev_floats(in, 32), *dout = dev_floats(NULL, 32);
    assert_int_equal(bug_warp_sum(din, dout, 0xffffffffu), cudaSuccess);
    host_floats(out, dout, 32);
    for (int i = 0; i < 32; i++) assert_true(out[i] == 496.f);
    assert_int_equal(bug_warp_sum(din, dout, 0x0000ffffu), cudaSuccess);
    expect_fault(cudaErrorIllegalInstruction, "kernel warp_sum_kernel", "__shfl_xor_sync", "which is not in the mask 0x0000ffff",
                 "bugs.cu:", NULL);
}

static void test_divergent_barrier(void **st)
{
    (void)st;
    float *d = dev_floats(NULL, 64);
    assert_int_equal(bug_divergent(d, 64, 64), cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(bug_divergent(d, 64, 32), cudaSuccess);
    expect_fault(cudaErrorIllegalInstruction, "kernel divergent_kernel", "__syncthreads", "bugs.cu:", NULL);
}

static void test_uninitialised_shared_read(void **st)
{
    (void)st;
    float *d = dev_floats(NULL, 32);
    assert_int_equal(bug_uninit(d, 1), cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(bug_uninit(d, 0), cudaSuccess);
    expect_fault(cudaErrorLaunchFailure, "kernel uninit_kernel", "no thread of this block wrote", "bugs.cu:",
                 "uninit_kernel(float*, int)::s", NULL);
}

static void test_shared_array_overrun(void **st)
{
    (void)st;
    float *d = dev_floats(NULL, 32);
    assert_int_equal(bug_shared_oob(d, 0), cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(bug_shared_oob(d, 1), cudaSuccess);
    expect_fault(cudaErrorIllegalAddress, "kernel shared_oob_kernel", "thread (31,0,0)", "past the end of a __shared__",
                 "shared_oob_kernel(float*, int)::s", NULL);
}

static void test_deadlock(void **st)
{
    (void)st;
    float *d = dev_floats(NULL, 32);
    assert_int_equal(bug_deadlock(d), cudaSuccess);
    expect_fault(cudaErrorIllegalInstruction, "kernel deadlock_kernel", "deadlock:", "__syncthreads (tests/cudasim/bugs.cu:",
                 NULL);
}

static void test_misaligned_vector_read(void **st)
{
    (void)st;
    float *d = dev_floats(NULL, 16), *o = dev_floats(NULL, 1);
    assert_int_equal(bug_vec(d, o, 4), cudaSuccess);
    assert_int_equal(cudaMemset(d, 0, 64), cudaSuccess);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
    assert_int_equal(bug_vec(d, o, 2), cudaSuccess);
    expect_fault(cudaErrorMisalignedAddress, "misaligned 16-byte read", "kernel vec_kernel", NULL);
}

/* A device pointer dereferenced on the host: SIGSEGV with the emulator's
 * line. Run in a fresh copy of this program (cmocka's own SIGSEGV
 * handler would catch it here). */
static int deref_main(void)
{
    float *d = NULL;
    if (cudaMalloc((void **)&d, 16))
        return 2;
    volatile float x = d[0];
    (void)x;
    return 0;
}

/* The host reads a result copied to pinned memory before synchronising. */
static int read_early_main(void)
{
    cudaStream_t s;
    float *pin, *d;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) || cudaMallocHost((void **)&pin, 64) ||
        cudaMalloc((void **)&d, 64) || cudaMemsetAsync(d, 0, 64, s) ||
        cudaMemcpyAsync(pin, d, 64, cudaMemcpyDeviceToHost, s))
        return 2;
    volatile float x = pin[0];
    (void)x;
    return 0;
}

/* Runs this program with arg; 1 when it died of the SIGSEGV, saying want. */
static int segv_saying(const char *arg, const char *want)
{
    int fds[2];
    assert_int_equal(pipe(fds), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (dup2(fds[1], 2) < 0)
            _exit(4);
        execl("/proc/self/exe", "test_cudasim", arg, (char *)NULL);
        _exit(3);
    }
    close(fds[1]);
    char buf[2048];
    size_t got = 0;
    ssize_t n;
    while ((n = read(fds[0], buf + got, sizeof buf - 1 - got)) > 0) got += (size_t)n; /* until the child is gone */
    buf[got] = 0;
    close(fds[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    /* SIGSEGV; under AddressSanitizer, whose handler the emulator's chains
     * to, a report and exit status 1 */
    int died = (WIFSIGNALED(status) && WTERMSIG(status) == SIGSEGV) || (WIFEXITED(status) && WEXITSTATUS(status) == 1);
    if (!died || !strstr(buf, want)) {
        print_message("%s: status 0x%x, stderr: %s\n", arg, status, buf);
        return 0;
    }
    return 1;
}

static void test_host_reads_pinned_before_sync(void **st)
{
    (void)st;
    assert_true(segv_saying("--read-before-sync", "pinned memory that queued device work has yet to read or write"));
}

static void test_host_reads_device_memory(void **st)
{
    (void)st;
    assert_true(segv_saying("--deref-device-pointer", "host code dereferenced a device pointer"));
}

/* ---- the dialect's arithmetic against oracles ---------------------------------------- */

__attribute__((target("f16c"))) static uint16_t f16c(float f)
{
    return (uint16_t)__builtin_ia32_vcvtps2ph((__attribute__((vector_size(16))) float){f, 0, 0, 0}, 0)[0];
}

static float bits_f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* r is the nearest half to f (ties to even), measured in float64: the
 * format's own definition. */
static int nearest_half(float f, uint16_t r)
{
    double x = f, v = bug_h2f(r), best = fabs(x - v);
    if (isnan(f))
        return r == 0x7fff;
    if (fabs(x) >= 65520.0)
        return r == (f > 0 ? 0x7c00 : 0xfc00);
    for (int d = -1; d <= 1; d += 2) {
        uint16_t o = (uint16_t)(r + d);
        if ((o & 0x7c00) == 0x7c00 || ((r & 0x7fff) == 0 && d < 0))
            continue;
        double e = fabs(x - bug_h2f(o));
        if (e < best || (e == best && (o & 1) == 0 && (r & 1)))
            return 0;
    }
    return 1;
}

static void test_half_rounding(void **st)
{
    (void)st;
    int hw = __builtin_cpu_supports("f16c");
    uint32_t special[] = {0, 0x80000000u, 0x7f800000u, 0xff800000u, 0x477fe000u, 0x477ff000u, 0x477fefffu, 0x33000000u,
                          0x33000001u, 0x387fc000u, 0x38800000u, 0x3f800000u, 0x7fc00000u, 0x00000001u, 0x3f801000u};
    long n = 0, mism = 0;
    for (int i = 0; i < 3000000 + (int)(sizeof special / 4); i++) {
        uint32_t u = i < (int)(sizeof special / 4) ? special[i] : next32();
        if (i % 2)
            u = (u & 0x8fffffffu) | 0x30000000u; /* many near the half range */
        float f = bits_f(u);
        uint16_t r = bug_f2h(f);
        if (!nearest_half(f, r))
            fail_msg("half of %a (0x%08x): 0x%04x is not the nearest", f, u, r);
        if (hw && !isnan(f))
            mism += f16c(f) != r;
        n++;
    }
    print_message("half: %ld conversions nearest-even; F16C %s, %ld differ\n", n, hw ? "present" : "absent", mism);
    assert_int_equal(mism, 0);
    for (uint32_t h = 0; h < 0x10000; h++) { /* every half back to float: exact */
        float f = bug_h2f((uint16_t)h);
        if ((h & 0x7c00) == 0x7c00 && (h & 0x3ff))
            assert_true(isnan(f));
        else
            assert_int_equal(bug_f2h(f), h);
    }
}

__attribute__((target("avx512bf16,avx512vl"))) static uint16_t hw_bf16(float f)
{
    typedef float v4 __attribute__((vector_size(16)));
    typedef short v8 __attribute__((vector_size(16)));
    v8 r = (v8)__builtin_ia32_cvtneps2bf16_v4sf((v4){f, 0, 0, 0});
    return (uint16_t)r[0];
}

static void test_bfloat16_rounding(void **st)
{
    (void)st;
    int hw = __builtin_cpu_supports("avx512bf16");
    long mism = 0, n = 0;
    for (int i = 0; i < 3000000; i++) {
        uint32_t u = next32();
        if (i % 3 == 0)
            u = (u & 0xffff0000u) | 0x8000u; /* exactly halfway between two bfloat16s: ties go to even */
        float f = bits_f(u);
        uint16_t r = bug_f2bf(f);
        if (isnan(f)) {
            assert_int_equal(r, 0x7fff);
            continue;
        }
        double x = f, v = bits_f((uint32_t)r << 16);
        if (!isfinite(v)) { /* overflow: only from |x| at or past the largest's rounding boundary */
            assert_true((u & 0x7fffffffu) >= 0x7f7f8000u);
            continue;
        }
        double lo = bits_f((uint32_t)(r - 1) << 16), hi = bits_f((uint32_t)(r + 1) << 16);
        double d = fabs(x - v), dl = isfinite(lo) ? fabs(x - lo) : INFINITY, dh = isfinite(hi) ? fabs(x - hi) : INFINITY;
        if (dl < d || dh < d || ((dl == d || dh == d) && (r & 1)))
            fail_msg("bfloat16 of %a (0x%08x): 0x%04x is not the nearest (ties to even)", f, u, r);
        /* the hardware flushes subnormal inputs: compare normal numbers */
        if (hw && (u & 0x7f800000u) && (u & 0x7f800000u) != 0x7f800000u) {
            mism += hw_bf16(f) != r;
            n++;
        }
    }
    print_message("bfloat16: nearest-even on 3M (1M exact ties); AVX512-BF16 %s, %ld of %ld differ\n",
                  hw ? "present" : "absent (skipped)", mism, n);
    assert_int_equal(mism, 0);
}

/* The device's math error: within the documented ulps of libm (expf 2,
 * logf 1, powf 4, sinf/cosf 2), not always libm's value (roughly 4 in 5
 * results are moved), and the same for the same input. */
static int within_ulps(float got, float ref, int ulps)
{
    float up = ref, dn = ref;
    for (int k = 0; k < ulps; k++) up = nextafterf(up, INFINITY), dn = nextafterf(dn, -INFINITY);
    return got >= dn && got <= up;
}

static void test_math_error_model(void **st)
{
    (void)st;
    int moved = 0, n = 100000;
    for (int i = 0; i < n; i++) {
        float x = (float)(next32() % 20000) / 1000.f - 10.f, y = (float)(next32() % 400) / 100.f - 2.f, s, c;
        float ax = fabsf(x) + 0.01f;
        bug_sincosf(x, &s, &c);
        assert_true(within_ulps(bug_expf(x), expf(x), 2));
        assert_true(within_ulps(bug_logf(ax), logf(ax), 1));
        assert_true(within_ulps(bug_powf(ax, y), powf(ax, y), 4));
        assert_true(within_ulps(s, sinf(x), 2) && within_ulps(c, cosf(x), 2));
        assert_true(bug_expf(x) == bug_expf(x));
        moved += bug_expf(x) != expf(x);
    }
    assert_true(moved > n / 2);
    assert_true(bug_powf(1.f, 3.f) == 1.f && bug_expf(0.f) == 1.f && bug_logf(1.f) == 0.f);
}

/* wmma::mma_sync against a float64 product of the same halves. */
static void test_wmma_against_float64(void **st)
{
    (void)st;
    uint16_t A[256], B[256];
    float C[256], D[256];
    for (int i = 0; i < 256; i++) {
        A[i] = bug_f2h((float)((int)(next32() % 2001) - 1000) / 250.f);
        B[i] = bug_f2h((float)((int)(next32() % 2001) - 1000) / 250.f);
        C[i] = (float)((int)(next32() % 201) - 100) / 10.f;
    }
    uint16_t *dA, *dB;
    /* twice A's 512 bytes: the misaligned load below (16 bytes in) must
     * fault on its alignment, not run past the allocation */
    assert_int_equal(cudaMalloc((void **)&dA, 1024), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&dB, sizeof B), cudaSuccess);
    assert_int_equal(cudaMemcpy(dA, A, sizeof A, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(cudaMemcpy(dB, B, sizeof B, cudaMemcpyHostToDevice), cudaSuccess);
    float *dC = dev_floats(C, 256), *dD = dev_floats(NULL, 256);
    assert_int_equal(bug_mma(dA, dB, dC, dD, 0), cudaSuccess);
    host_floats(D, dD, 256);
    double worst = 0;
    for (int i = 0; i < 16; i++)
        for (int j = 0; j < 16; j++) {
            double ref = C[i * 16 + j];
            for (int k = 0; k < 16; k++) ref += (double)bug_h2f(A[i * 16 + k]) * bug_h2f(B[k * 16 + j]);
            worst = fmax(worst, fabs(ref - D[i * 16 + j]) / (fabs(ref) + 1));
        }
    print_message("wmma 16x16x16: max relative error %.2e against float64\n", worst);
    assert_true(worst < 1e-5);
    assert_int_equal(bug_mma(dA, dB, dC, dD, 8), cudaSuccess); /* 16 bytes in: not 256-bit aligned */
    expect_fault(cudaErrorMisalignedAddress, "wmma::load_matrix_sync", "not 256-bit aligned", "bugs.cu:", NULL);
}

/* ---- the runtime's semantics ----------------------------------------------------------- */

static void test_launch_configuration(void **st)
{
    (void)st;
    assert_int_equal(bug_config(0, 32, 0), cudaErrorInvalidConfiguration);
    assert_int_equal(cudaGetLastError(), cudaSuccess); /* taken by the launcher's cudaGetLastError */
    assert_int_equal(bug_config(1, 1025, 0), cudaErrorInvalidConfiguration);
    assert_int_equal(bug_config(1, 32, 60 * 1024), cudaErrorInvalidValue);
    assert_int_equal(bug_allow_smem(64 * 1024), cudaSuccess);
    assert_int_equal(bug_config(1, 32, 60 * 1024), cudaSuccess);
    assert_int_equal(bug_allow_smem(300 * 1024), cudaErrorInvalidValue);
    assert_int_equal(cudaDeviceSynchronize(), cudaSuccess);
}

static void test_atomics(void **st)
{
    (void)st;
    int *c, h = 0;
    assert_int_equal(cudaMalloc((void **)&c, 4), cudaSuccess);
    cudaMemset(c, 0, 4);
    assert_int_equal(bug_count(c, 7, 96), cudaSuccess);
    cudaMemcpy(&h, c, 4, cudaMemcpyDeviceToHost);
    assert_int_equal(h, 7 * 96);
}

/* Work runs when waited for: a kernel's result copied to pinned memory is
 * only there after the stream is synchronised (reading it before is a
 * SIGSEGV: test_host_reads_pinned_before_sync). */
static void test_streams_are_lazy(void **st)
{
    (void)st;
    cudaStream_t s;
    assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    float *pin, in[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    assert_int_equal(cudaMallocHost((void **)&pin, 32), cudaSuccess);
    for (int i = 0; i < 8; i++) pin[i] = -1;
    float *din = dev_floats(NULL, 8), *dout = dev_floats(NULL, 8);
    assert_int_equal(cudaMemcpyAsync(din, in, 32, cudaMemcpyHostToDevice, s), cudaSuccess);
    in[0] = 100; /* pageable: staged at the call */
    assert_int_equal(bug_inc(din, dout, 8, s), cudaSuccess);
    assert_int_equal(cudaMemcpyAsync(pin, dout, 32, cudaMemcpyDeviceToHost, s), cudaSuccess);
    assert_int_equal(cudaStreamQuery(s), cudaErrorNotReady);
    assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
    for (int i = 0; i < 8; i++) assert_true(pin[i] == (float)(i + 2));
    cudaFreeHost(pin);
    cudaStreamDestroy(s);
}

/* A synchronous copy from pageable memory, then a kernel on a
 * non-blocking stream: nothing orders them. */
static void test_unordered_copy_is_a_hazard(void **st)
{
    (void)st;
    cudaStream_t s;
    assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    float in[8] = {0}, *din = dev_floats(NULL, 8), *dout = dev_floats(NULL, 8);
    assert_int_equal(cudaMemcpy(din, in, 32, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(bug_inc(din, dout, 8, s), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(s), cudaErrorLaunchFailure);
    assert_non_null(strstr(cusim_last_report(), "still queued on another stream (the NULL stream)"));
    cudaDeviceReset();
}

/* Capture: unsafe calls are refused and void the capture; a graph replays
 * its kernels and reads pinned memory anew at each launch. */
static void test_capture_and_graphs(void **st)
{
    (void)st;
    cudaStream_t s;
    cudaGraph_t g = NULL;
    cudaGraphExec_t ex = NULL;
    void *p = NULL;
    assert_int_equal(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    assert_int_equal(cudaStreamBeginCapture(NULL, cudaStreamCaptureModeThreadLocal), cudaErrorStreamCaptureUnsupported);
    assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    assert_int_equal(cudaMalloc(&p, 64), cudaErrorStreamCaptureUnsupported);
    assert_int_equal(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    assert_null(g);
    (void)cudaGetLastError(); /* the launchers below return the last error: clear it, as code must */

    float *pin, *out;
    assert_int_equal(cudaMallocHost((void **)&pin, 32), cudaSuccess);
    assert_int_equal(cudaMallocHost((void **)&out, 32), cudaSuccess);
    float *din = dev_floats(NULL, 8), *dout = dev_floats(NULL, 8);
    assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    assert_int_equal(cudaMemcpyAsync(din, pin, 32, cudaMemcpyHostToDevice, s), cudaSuccess);
    assert_int_equal(bug_inc(din, dout, 8, s), cudaSuccess);
    assert_int_equal(cudaMemcpyAsync(out, dout, 32, cudaMemcpyDeviceToHost, s), cudaSuccess);
    assert_int_equal(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported);
    assert_int_equal(cudaStreamEndCapture(s, &g), cudaErrorStreamCaptureInvalidated);
    (void)cudaGetLastError();
    assert_int_equal(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    cudaMemcpyAsync(din, pin, 32, cudaMemcpyHostToDevice, s);
    bug_inc(din, dout, 8, s);
    cudaMemcpyAsync(out, dout, 32, cudaMemcpyDeviceToHost, s);
    assert_int_equal(cudaStreamEndCapture(s, &g), cudaSuccess);
    assert_int_equal(cudaGraphInstantiate(&ex, g, 0), cudaSuccess);
    for (int round = 0; round < 3; round++) {
        for (int i = 0; i < 8; i++) pin[i] = (float)(10 * round + i);
        assert_int_equal(cudaGraphLaunch(ex, s), cudaSuccess);
        assert_int_equal(cudaStreamSynchronize(s), cudaSuccess);
        for (int i = 0; i < 8; i++) assert_true(out[i] == (float)(10 * round + i + 1));
    }
    cudaGraphExecDestroy(ex);
    cudaGraphDestroy(g);
    cudaFreeHost(pin);
    cudaFreeHost(out);
    cudaStreamDestroy(s);
}

static void test_freed_memory(void **st)
{
    (void)st;
    float *d = dev_floats(NULL, 64);
    assert_int_equal(cudaFree(d), cudaSuccess);
    assert_int_equal(cudaFree(d), cudaErrorInvalidValue);
    (void)cudaGetLastError();
    assert_int_equal(bug_stride(d, 8, 1), cudaSuccess);
    expect_fault(cudaErrorIllegalAddress, "already freed", "kernel stride_kernel", NULL);
}

/* cublasGemmEx against float64 for every transpose pair, padded leading
 * dimensions and half inputs; the documented argument errors. */
static void gemm_case(cublasHandle_t h, int ta, int tb, int m, int n, int k, cudaDataType dt, cublasComputeType_t ct)
{
    int lda = (ta ? k : m) + 3, ldb = (tb ? n : k) + 1, ldc = m + 2;
    size_t na = (size_t)lda * (ta ? m : k), nb = (size_t)ldb * (tb ? k : n), nc = (size_t)ldc * n, es = dt == CUDA_R_32F ? 4 : 2;
    float *A = malloc(na * 4), *B = malloc(nb * 4), *C = malloc(nc * 4);
    uint16_t *Ah = malloc(na * 2), *Bh = malloc(nb * 2);
    /* k/64 for |k| <= 100: exact in half, bfloat16 and TF32, so every type
     * must give the float64 product (up to FP32 sums) */
    int bf = dt == CUDA_R_16BF;
    for (size_t i = 0; i < na; i++) A[i] = (float)((int)(next32() % 201) - 100) / 64.f, Ah[i] = bf ? bug_f2bf(A[i]) : bug_f2h(A[i]);
    for (size_t i = 0; i < nb; i++) B[i] = (float)((int)(next32() % 201) - 100) / 64.f, Bh[i] = bf ? bug_f2bf(B[i]) : bug_f2h(B[i]);
    void *dA, *dB;
    float *dC;
    assert_true(A && B && C && Ah && Bh);
    assert_int_equal(cudaMalloc(&dA, na * es), cudaSuccess);
    assert_int_equal(cudaMalloc(&dB, nb * es), cudaSuccess);
    assert_int_equal(cudaMalloc((void **)&dC, nc * 4), cudaSuccess);
    assert_int_equal(cudaMemcpy(dA, es == 4 ? (void *)A : (void *)Ah, na * es, cudaMemcpyHostToDevice), cudaSuccess);
    assert_int_equal(cudaMemcpy(dB, es == 4 ? (void *)B : (void *)Bh, nb * es, cudaMemcpyHostToDevice), cudaSuccess);
    float one = 1.f, zero = 0.f;
    assert_int_equal(cublasGemmEx(h, ta ? CUBLAS_OP_T : CUBLAS_OP_N, tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &one, dA, dt,
                                  lda, dB, dt, ldb, &zero, dC, CUDA_R_32F, ldc, ct, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_SUCCESS);
    assert_int_equal(cudaMemcpy(C, dC, nc * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    for (int j = 0; j < n; j++)
        for (int i = 0; i < m; i++) {
            double ref = 0;
            for (int l = 0; l < k; l++)
                ref += (double)(ta ? A[l + (size_t)i * lda] : A[i + (size_t)l * lda]) *
                       (tb ? B[j + (size_t)l * ldb] : B[l + (size_t)j * ldb]);
            if (fabs(ref - C[i + (size_t)j * ldc]) > 1e-4 * (1 + fabs(ref)))
                fail_msg("gemm ta %d tb %d %dx%dx%d: C(%d,%d) %g want %g", ta, tb, m, n, k, i, j, C[i + (size_t)j * ldc], ref);
        }
    cudaFree(dA), cudaFree(dB), cudaFree(dC);
    free(A), free(B), free(C), free(Ah), free(Bh);
}

static void test_cublas_gemm(void **st)
{
    (void)st;
    cublasHandle_t h;
    assert_int_equal(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++) {
            gemm_case(h, ta, tb, 7, 5, 33, CUDA_R_32F, CUBLAS_COMPUTE_32F);
            gemm_case(h, ta, tb, 7, 5, 33, CUDA_R_32F, CUBLAS_COMPUTE_32F_FAST_TF32);
            gemm_case(h, ta, tb, 16, 9, 40, CUDA_R_16F, CUBLAS_COMPUTE_32F);
            gemm_case(h, ta, tb, 16, 9, 40, CUDA_R_16BF, CUBLAS_COMPUTE_32F);
        }
    float one = 1, zero = 0, *d;
    cudaMalloc((void **)&d, 64 * 4);
    assert_int_equal(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, d, CUDA_R_32F, 4, d, CUDA_R_32F, 8, &zero, d,
                                  CUDA_R_32F, 8, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_INVALID_VALUE); /* lda < m */
    assert_int_equal(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 8, 8, 8, &one, d, CUDA_R_16F, 8, d, CUDA_R_32F, 8, &zero, d,
                                  CUDA_R_32F, 8, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_NOT_SUPPORTED);
    /* A transposed read as 16 x 8 with lda 16 spans 128 floats of a 64-float buffer */
    assert_int_equal(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, 8, 8, 16, &one, d, CUDA_R_32F, 16, d, CUDA_R_32F, 16, &zero,
                                  d, CUDA_R_32F, 8, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                     CUBLAS_STATUS_SUCCESS);
    expect_fault(cudaErrorIllegalAddress, "cublasGemmEx", NULL);
    cublasDestroy(h);
}

/* NCCL: ranks on two threads, one device each; every rank gets the sum. */
typedef struct rank_arg {
    ncclComm_t comm;
    int dev, rank, rc;
    float got[100];
} rank_arg;

/* rc: 0, or the number (1-8) of the call that failed. */
static void *rank_main(void *p)
{
    rank_arg *a = p;
    cudaStream_t s;
    float h[100], *d = NULL;
    for (int i = 0; i < 100; i++) h[i] = (float)(i * (a->rank + 1));
    int rc[8] = {cudaSetDevice(a->dev), cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking),
                 cudaMalloc((void **)&d, sizeof h)};
    for (int i = 0; i < 3; i++)
        if (rc[i]) {
            a->rc = i + 1;
            return NULL;
        }
    rc[3] = cudaMemcpyAsync(d, h, sizeof h, cudaMemcpyHostToDevice, s);
    rc[4] = ncclAllReduce(d, d, 100, ncclFloat, ncclSum, a->comm, s);
    rc[5] = bug_inc(d, d, 100, s);
    rc[6] = cudaMemcpyAsync(a->got, d, sizeof h, cudaMemcpyDeviceToHost, s);
    rc[7] = cudaStreamSynchronize(s);
    for (int i = 3; i < 8 && !a->rc; i++)
        if (rc[i])
            a->rc = i + 1;
    return NULL;
}

static void test_nccl_allreduce(void **st)
{
    (void)st;
    int n = 0;
    cudaGetDeviceCount(&n);
    if (n < 2)
        skip();
    ncclComm_t comms[2];
    int devs[2] = {0, 1};
    assert_int_equal(ncclCommInitAll(comms, 2, devs), ncclSuccess);
    rank_arg a[2] = {{comms[0], 0, 0, 0, {0}}, {comms[1], 1, 1, 0, {0}}};
    pthread_t t[2];
    for (int r = 0; r < 2; r++) assert_int_equal(pthread_create(&t[r], NULL, rank_main, &a[r]), 0);
    for (int r = 0; r < 2; r++) pthread_join(t[r], NULL);
    for (int r = 0; r < 2; r++) {
        if (a[r].rc)
            fail_msg("rank %d: call %d failed", r, a[r].rc);
        for (int i = 0; i < 100; i++) assert_true(a[r].got[i] == (float)(3 * i) + 1.f);
    }
    ncclCommDestroy(comms[0]);
    ncclCommDestroy(comms[1]);
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--deref-device-pointer"))
        return deref_main();
    if (argc > 1 && !strcmp(argv[1], "--read-before-sync"))
        return read_early_main();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(test_missing_barrier_is_a_race, setup),
        cmocka_unit_test_setup(test_wrong_stride_is_out_of_bounds, setup),
        cmocka_unit_test_setup(test_shuffle_mask_names_missing_lanes, setup),
        cmocka_unit_test_setup(test_divergent_barrier, setup),
        cmocka_unit_test_setup(test_uninitialised_shared_read, setup),
        cmocka_unit_test_setup(test_shared_array_overrun, setup),
        cmocka_unit_test_setup(test_deadlock, setup),
        cmocka_unit_test_setup(test_misaligned_vector_read, setup),
        cmocka_unit_test_setup(test_host_reads_device_memory, setup),
        cmocka_unit_test_setup(test_host_reads_pinned_before_sync, setup),
        cmocka_unit_test_setup(test_half_rounding, setup),
        cmocka_unit_test_setup(test_bfloat16_rounding, setup),
        cmocka_unit_test_setup(test_math_error_model, setup),
        cmocka_unit_test_setup(test_wmma_against_float64, setup),
        cmocka_unit_test_setup(test_launch_configuration, setup),
        cmocka_unit_test_setup(test_atomics, setup),
        cmocka_unit_test_setup(test_streams_are_lazy, setup),
        cmocka_unit_test_setup(test_unordered_copy_is_a_hazard, setup),
        cmocka_unit_test_setup(test_capture_and_graphs, setup),
        cmocka_unit_test_setup(test_freed_memory, setup),
        cmocka_unit_test_setup(test_cublas_gemm, setup),
        cmocka_unit_test_setup(test_nccl_allreduce, setup),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
