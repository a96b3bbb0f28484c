// Element-wise kernels of the library: vector add (the classic first kernel, used by the
// benchmarks as a bandwidth-bound launch) and typed fills.
//
// One thread per element, with grid-stride loops so any grid covers any n; 64-bit
// indices so n may pass 2^31.

extern "C" __global__ void sc_vector_add_f32(const float *__restrict__ a,
                                              const float *__restrict__ b,
                                              float *__restrict__ c, unsigned long long n)
{
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    // Four elements per thread per step through 16-byte loads where the pointers allow.
    if ((((unsigned long long)a | (unsigned long long)b | (unsigned long long)c) & 15) == 0) {
        unsigned long long n4 = n / 4;
        const float4 *a4 = reinterpret_cast<const float4 *>(a);
        const float4 *b4 = reinterpret_cast<const float4 *>(b);
        float4 *c4 = reinterpret_cast<float4 *>(c);
        for (unsigned long long k = i; k < n4; k += stride) {
            float4 x = a4[k], y = b4[k];
            c4[k] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
        }
        for (unsigned long long k = n4 * 4 + i; k < n; k += stride)
            c[k] = a[k] + b[k];
    } else {
        for (unsigned long long k = i; k < n; k += stride)
            c[k] = a[k] + b[k];
    }
}

template <typename T>
__global__ void sc_fill(T *__restrict__ out, T value, unsigned long long n)
{
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    for (; i < n; i += stride)
        out[i] = value;
}

// Instantiations the library uses (name expressions "sc_fill<...>").
template __global__ void sc_fill<unsigned long long>(unsigned long long *, unsigned long long,
                                                     unsigned long long);
template __global__ void sc_fill<float>(float *, float, unsigned long long);
