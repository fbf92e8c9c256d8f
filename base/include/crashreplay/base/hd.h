// Marks for code that compiles for both host and device (DESIGN decision 8).
//
// A kernel's arithmetic and checks are written once as CR_HD functions; the
// CPU backend calls them from plain C++ loops and the CUDA backend from
// __global__ launchers. CR_HD code must not allocate, throw, or use std
// containers: it only reads and writes the spans it is given.
#pragma once

#if defined(__CUDACC__)
#define CR_HD __host__ __device__ __forceinline__
#define CR_HD_NOINLINE __host__ __device__
#else
#define CR_HD inline
#define CR_HD_NOINLINE
#endif
