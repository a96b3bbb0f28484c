/* FP8 quantization (internal): the kernels of kernels/quant/fp8_quant.cu the calls of
 * include/safecuda/quant.h launch, for the tests that compile them. */
#ifndef SAFECUDA_QUANT_QUANT_H
#define SAFECUDA_QUANT_QUANT_H

#define SCI_QUANT_FILE "quant/fp8_quant.cu"

typedef enum sci_quant_kernel {
    SCI_QUANT_K_BLOCKS,            /* sc_quantize_fp8_blocks */
    SCI_QUANT_K_TOKENS,            /* sc_quantize_fp8_tokens */
    SCI_QUANT_K_DEQ_BLOCKS_BF16,   /* sc_dequantize_fp8_blocks, bf16 out */
    SCI_QUANT_K_DEQ_BLOCKS_F32,    /* f32 out */
    SCI_QUANT_K_DEQ_TOKENS_BF16,   /* sc_dequantize_fp8_tokens, bf16 out */
    SCI_QUANT_K_DEQ_TOKENS_F32,    /* f32 out */
    SCI_QUANT_K_COUNT
} sci_quant_kernel;

/* The kernels' names (extern "C"), by sci_quant_kernel. */
extern const char *const sci_quant_kernels[SCI_QUANT_K_COUNT];

#endif
