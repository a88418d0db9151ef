// What a module is built from, recorded where the code that was compiled in says it: each fact
// is a "name=value" string in the module's ELF section .activekv_sbom, spelled from the macros of
// the headers the compiler actually used, never typed in. cmake/write_sbom.py makes the wheel's
// SBOM from them and the payload gate checks the SBOM against them (docs/sbom.md).
// Plain C preprocessor and attributes only: nvcc's host g++ compiles it too (probe.cu).
#pragma once

#define ACTIVEKV_SBOM_TEXT_(x) #x
#define ACTIVEKV_SBOM_TEXT(x) ACTIVEKV_SBOM_TEXT_(x)

// `used` keeps the string in the object, `retain` keeps it through the linker's --gc-sections.
#define ACTIVEKV_SBOM_FACT(identifier, text)                                        \
  __attribute__((used, retain, section(".activekv_sbom"))) static const char \
      identifier[] = text

// The CUDA runtime the objects were compiled against (linked statically: cudart_static) and the
// GPU architectures they carry; in each .cu file a module may pull in without the others.
#define ACTIVEKV_SBOM_CUDA_FACTS()                                                              \
  ACTIVEKV_SBOM_FACT(kCudaRuntimeFact, "cuda_runtime=" ACTIVEKV_SBOM_TEXT(CUDART_VERSION)); \
  ACTIVEKV_SBOM_FACT(kCudaArchitecturesFact, "cuda_architectures=" ACTIVEKV_CUDA_ARCHITECTURES)
