// Weight formats: Marlin-packed codes straight into tensor-core fragments.
//
// The kernels compute C^T = W^T . A^T: the weight is the MMA's *A* operand
// (16 output columns x 16 input features per fragment) and the activations are
// its *B* operand. Per 16x16 tile a lane holds, in the Marlin lane order (see
// ferrum_ffi/formats/marlin.py), W at columns c = lane/4 and c + 8 and at
// rows (K) r, r+1, r+8, r+9 with r = 2*(lane%4):
//   4-bit: one word, nibbles 0|4 = (c; r, r+1), 1|5 = (c; r+8, r+9),
//          2|6 = (c+8; r, r+1), 3|7 = (c+8; r+8, r+9);
//   8-bit: two words (column c, then c + 8), even bytes = rows r, r+1 and odd
//          bytes = rows r+8, r+9.
// Fragment registers {r0, r1, r2, r3} of mma.m16n8k16 are (c; k, k+1),
// (c+8; k, k+1), (c; k+8, k+9), (c+8; k+8, k+9).
//
// Ways to turn codes into products, chosen per kernel and slab height:
// * dequant(): exact values (q - zero), then scaled in fp16/bf16 and one MMA:
//   the tensor cores are the bottleneck for tall slabs, so no extra MMAs. The
//   warp-specialised kernel's 16-row tile multiplies them unscaled and scales
//   each slot's fp32 partials (fold_scaled).
// * images(): the raw fp16/bf16 image of each code, made by bit operations
//   only (no floating-point work), multiplied as is; the affine part is
//   removed by one more MMA per k step with a constant correction fragment
//   (for zero points: the activation sums, weighed per column in fp32), and
//   scales are applied to the fp32 partial sums (fold_images). For the 8-warp
//   kernel's short slabs the fp16 pipe, not the tensor cores, limits, and
//   this moves nearly all of its work to the idle MMA units.
#pragma once

#include "numeric.cuh"

namespace ferrum {

struct Frag16x16 {
  uint32_t r[4];
};

constexpr uint32_t kLop3Or = 0xEAu;  // lop3 table for (a & b) | c

__device__ __forceinline__ uint32_t nibble_pair(uint32_t word, uint32_t exponent) {
  return ptx::lop3<kLop3Or>(word, 0x000f000fu, exponent);
}

// nibble_pair(word >> 4, Image) by one fp16 FMA instead of a shift: the
// 8-row slabs' stages saturate the integer pipe, the FMA pipe has room. The
// nibbles at bits 4..7, read in place under fp16's exponent, are x = 1024 +
// 16q; the result's bits are Image | q, an fp16 value v + q u (v the value of
// Image, u its mantissa step), so x u / 16 + v - 64 u is exact. Images: fp16
// 1024 + q; bf16 128 + q and 2048 + 16q (fp16 3.5 + q / 512, 5 + q / 256).
template <uint32_t Image>
__device__ __forceinline__ uint32_t high_nibble_pair(uint32_t word) {
  static_assert(Image == 0x64006400u || Image == 0x43004300u || Image == 0x45004500u, "no fp16 form");
  constexpr uint32_t kMul = Image == 0x64006400u ? 0x2c002c00u : Image == 0x43004300u ? 0x08000800u : 0x0c000c00u;
  constexpr uint32_t kAdd = Image == 0x64006400u ? 0x63806380u : Image == 0x43004300u ? 0x42c042c0u : 0x44c044c0u;
  return Num<AType::F16>::fma(ptx::lop3<kLop3Or>(word, 0x00f000f0u, 0x64006400u), kMul, kAdd);
}

// Four equal registers, or {x, y, x, y} as a 16x16 fragment.
__device__ __forceinline__ Frag16x16 splat(uint32_t x) { return Frag16x16{{x, x, x, x}}; }

// Per-register pairs for rows of different groups: p0, p1, p8, p9 are the
// pairs {v(c), v(c+8)} (scales, or E + zero point) of the groups of rows k,
// k+1, k+8 and k+9; register i gets its column's values of its two rows.
__device__ __forceinline__ Frag16x16 row_pairs(uint32_t p0, uint32_t p1, uint32_t p8, uint32_t p9) {
  return Frag16x16{{__byte_perm(p0, p1, 0x5410), __byte_perm(p0, p1, 0x7632), __byte_perm(p8, p9, 0x5410),
                    __byte_perm(p8, p9, 0x7632)}};
}

template <AType A, WType W>
struct Format {
  using N = Num<A>;
  static constexpr bool bf16 = A == AType::BF16;
  static constexpr int bits = weight_bits(W);
  static constexpr int words = bits / 4;  // 32-bit words per lane per tile
  static constexpr bool zero_points = W == WType::U4;
  // MXFP4: one E8M0 byte per scale, in the grouped Marlin scale order.
  static constexpr bool e8m0_scales = W == WType::FE2M1;
  static constexpr int scale_bytes = e8m0_scales ? 1 : 2;
  static_assert(W != WType::FE2M1 || bf16, "MXFP4 is built for bf16 activations");
  // Image path only: the activations' k+8 half is divided by 16 (fp16 U4B8,
  // whose high images are 1024 + 16q: one shift fewer per word).
  static constexpr bool act_hi_div16 = W == WType::U4B8 && !bf16;
  // bf16 holds 8 significant bits, too few for 128 + q with an 8-bit q: the
  // code q = lo + 16 hi becomes two images, 128 + lo and 2048 + 16 hi (both
  // exact), that each multiply the activations.
  static constexpr bool two_images = bits == 8 && bf16 && W == WType::U8B128;
  static constexpr bool const_correction = W == WType::U4B8 || W == WType::U8B128;
  // Exponent bits OR-ed onto a nibble: fp16 1024 + q, bf16 128 + q (exact).
  static constexpr uint32_t kExp = bf16 ? 0x43004300u : 0x64006400u;
  // MXFP4 images are value * 2^-126: products with plain activations would
  // fall below fp32's normal range. The image path multiplies the activations
  // by 2^64 (bf16 pair kImageActScale; exact while |a| < 2^64), so its fp32
  // sums carry a factor 2^-62 that the column's end removes (kImageAccUnit)
  // once, instead of one multiply by 2^126 per code pair.
  static constexpr uint32_t kImageActScale = W == WType::FE2M1 ? 0x5f805f80u : 0u;  // 2^64
  static constexpr float kImageAccUnit = W == WType::FE2M1 ? 0x1p62f : 1.f;
  // bf16 INT4 on the 8-warp kernel's image path: bare images (see bare()).
  // Their activations' k and k+8 halves are scaled by 2^64 and 2^60 (exact
  // while |a| < 2^64, as MXFP4's), so every product is a q 2^-69, in fp32's
  // normal range, and the column's end multiplies by 2^69 once.
  static constexpr bool bare_images = bf16 && (W == WType::U4B8 || W == WType::U4);
  static constexpr uint32_t kBareActScaleLo = 0x5f805f80u;  // 2^64
  static constexpr uint32_t kBareActScaleHi = 0x5d805d80u;  // 2^60
  static constexpr float kBareAccUnit = 0x1p69f;
  // The offset E that zero_pair() adds to a zero point (128 in bf16).
  static constexpr float kZeroPairOffset = bf16 ? 128.f : 1024.f;

  // {E + z(c), E + z(c+8)} of tile t from the lane's zero-point word (nibbles
  // z0 z2 z4 z6 z1 z3 z5 z7, z_j for column c + 8j).
  __device__ static uint32_t zero_pair(uint32_t zword, int t) { return nibble_pair(zword >> (4 * t), kExp); }

  __device__ static void images(const uint32_t* w, Frag16x16& f, Frag16x16& f_hi) {
    if constexpr (W == WType::FE2M1) {
      // Nibbles as in the 4-bit layout below: registers 0 and 2 take the
      // nibbles at bits 0..3 and 4..7 of each half, 1 and 3 those at 8..11
      // and 12..15 (brought down by one shift).
      const uint32_t high = w[0] >> 8;
      f.r[0] = fp4_pair(w[0] & 0x000f000fu, (1u << 6) + (1u << 12));
      f.r[2] = fp4_pair(w[0] & 0x00f000f0u, (1u << 2) + (1u << 8));
      f.r[1] = fp4_pair(high & 0x000f000fu, (1u << 6) + (1u << 12));
      f.r[3] = fp4_pair(high & 0x00f000f0u, (1u << 2) + (1u << 8));
    } else if constexpr (bits == 4) {
      if constexpr (act_hi_div16) {
        // High nibbles stay in place: 1024 + 16q, exact in fp16.
        f.r[0] = ptx::lop3<kLop3Or>(w[0], 0x000f000fu, kExp);
        f.r[2] = ptx::lop3<kLop3Or>(w[0], 0x00f000f0u, kExp);
        f.r[1] = ptx::lop3<kLop3Or>(w[0] >> 8, 0x000f000fu, kExp);
        f.r[3] = ptx::lop3<kLop3Or>(w[0] >> 8, 0x00f000f0u, kExp);
      } else {
        // Every image E + q (U4 wants one zero-point offset per column for all
        // k); the nibbles at bits 4..7 without a shift (see high_nibble_pair).
        const uint32_t high = w[0] >> 8;
        f.r[0] = nibble_pair(w[0], kExp);
        f.r[2] = high_nibble_pair<kExp>(w[0]);
        f.r[1] = nibble_pair(high, kExp);
        f.r[3] = high_nibble_pair<kExp>(high);
      }
    } else if constexpr (W == WType::U8B128 && !bf16) {
      // Byte q under exponent 0x64: 1024 + q.
      f.r[0] = __byte_perm(w[0], 0x64646464u, 0x4240);
      f.r[2] = __byte_perm(w[0], 0x64646464u, 0x4341);
      f.r[1] = __byte_perm(w[1], 0x64646464u, 0x4240);
      f.r[3] = __byte_perm(w[1], 0x64646464u, 0x4341);
    } else if constexpr (W == WType::U8B128) {
      // q = lo + 16 hi: images 128 + lo and, under exponent 2^11 (mantissa
      // step 16), 2048 + 16 hi.
      constexpr uint32_t kExpHi = 0x45004500u;
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const uint32_t high = w[i] >> 8;
        f.r[i] = nibble_pair(w[i], kExp);
        f_hi.r[i] = high_nibble_pair<kExpHi>(w[i]);
        f.r[i + 2] = nibble_pair(high, kExp);
        f_hi.r[i + 2] = high_nibble_pair<kExpHi>(high);
      }
    } else {
      f.r[0] = fp8_odd(w[0] << 8);
      f.r[2] = fp8_odd(w[0]);
      f.r[1] = fp8_odd(w[1] << 8);
      f.r[3] = fp8_odd(w[1]);
    }
  }

  // Bare images of bf16 INT4 codes: each nibble alone, read as bf16 bits
  // whose exponent field is 0 or 1 (subnormals and the first binade share one
  // step, 2^-133), is q 2^-133 at bits 0..3 and q 2^-129 in place at bits
  // 4..7 -- exact and linear in q, so the high nibbles need no shift and no
  // FMA (the fp16 U4B8 form, which bf16's 7-bit mantissa cannot hold under
  // an exponent). Registers 0 and 1 (rows k, k+1) take the low positions, 2
  // and 3 (rows k+8, k+9) the high ones: the activations' halves carry the
  // factor 16 between them (kBareActScaleLo / Hi).
  __device__ static void bare(const uint32_t* w, Frag16x16& f) {
    static_assert(bare_images, "bf16 INT4 only");
    const uint32_t high = w[0] >> 8;
    f.r[0] = w[0] & 0x000f000fu;
    f.r[2] = w[0] & 0x00f000f0u;
    f.r[1] = high & 0x000f000fu;
    f.r[3] = high & 0x00f000f0u;
  }

  // The correction fragment of bare images in their units (rows k, k+1:
  // 2^-133, rows k+8, k+9: 2^-129): -8 for U4B8, -1 for U4 (weighed by each
  // column's zero point in fp32, see fold_images).
  __device__ static Frag16x16 bare_correction() {
    static_assert(bare_images, "bf16 INT4 only");
    if constexpr (W == WType::U4B8) return Frag16x16{{0x80088008u, 0x80088008u, 0x80808080u, 0x80808080u}};
    return Frag16x16{{0x80018001u, 0x80018001u, 0x80108010u, 0x80108010u}};
  }

  // The constant fragment whose product with the activations removes the
  // images' offsets. For U4 the offset E + z differs per column, so the
  // fragment is -1 and yields -(sum of the activations), which the kernel
  // weighs with each column's E + z in fp32.
  __device__ static Frag16x16 correction() {
    if constexpr (W == WType::U4B8) {
      if constexpr (bf16) return splat(0xc308c308u);                           // -136
      return Frag16x16{{0xe408e408u, 0xe408e408u, 0xe480e480u, 0xe480e480u}};  // -1032, -1152
    } else if constexpr (W == WType::U8B128) {
      if constexpr (bf16) return splat(0xc510c510u);  // -(128 + 2048 + 128) = -2304
      return splat(0xe480e480u);                      // -1152
    } else if constexpr (W == WType::U4) {
      return splat(bf16 ? 0xbf80bf80u : 0xbc00bc00u);  // -1
    } else {
      return splat(0u);  // FP8 images need no correction
    }
  }

  // {scale(c), scale(c+8)} of tiles 0..3 from the lane's eight E8M0 bytes
  // (x: tiles 0, 1; y: tiles 2, 3): 2^(e-127) is the bf16 whose exponent
  // field is e. e = 0 (2^-127) becomes 0, which only ever meets padding.
  __device__ static void e8m0_pairs(uint32_t x, uint32_t y, uint32_t (&sp)[4]) {
    sp[0] = __byte_perm(x, 0u, 0x4140) << 7;
    sp[1] = __byte_perm(x, 0u, 0x4342) << 7;
    sp[2] = __byte_perm(y, 0u, 0x4140) << 7;
    sp[3] = __byte_perm(y, 0u, 0x4342) << 7;
  }

  // Exact unscaled weight values (q - zero; FP8: value / 256; E2M1: value),
  // U4 with one zero-point pair {E + z(c), E + z(c+8)} for all four rows.
  __device__ static Frag16x16 dequant(const uint32_t* w, uint32_t zero) {
    if constexpr (zero_points && !bf16) {
      // The high nibbles in place (x = 1024 + 16q) need no image of their own:
      // x/16 - (64 + z) = q - z is one exact FMA, with -(64 + z) = 960 - (E +
      // z) made once per zero pair (the callers' unrolled steps share it).
      const uint32_t neg_hi = N::sub(0x63806380u, zero);
      const uint32_t high = w[0] >> 8;
      Frag16x16 f;
      f.r[0] = N::sub_low(nibble_pair(w[0], kExp), zero);
      f.r[1] = N::sub_high(nibble_pair(high, kExp), zero);
      f.r[2] = N::fma_low(ptx::lop3<kLop3Or>(w[0], 0x00f000f0u, kExp), 0x2c002c00u, neg_hi);
      f.r[3] = N::fma_high(ptx::lop3<kLop3Or>(high, 0x00f000f0u, kExp), 0x2c002c00u, neg_hi);
      return f;
    } else if constexpr (zero_points) {
      // {E + z(c), E + z(c+8)}: registers 0, 2 take column c, 1, 3 column c + 8.
      Frag16x16 f, f_hi;
      images(w, f, f_hi);
      f.r[0] = N::sub_low(f.r[0], zero);
      f.r[1] = N::sub_high(f.r[1], zero);
      f.r[2] = N::sub_low(f.r[2], zero);
      f.r[3] = N::sub_high(f.r[3], zero);
      return f;
    } else {
      return dequant(w, Frag16x16{});
    }
  }

  // The same with each register's own offset pair (U4: E + z of its rows;
  // rows of different groups, see row_pairs).
  __device__ static Frag16x16 dequant(const uint32_t* w, const Frag16x16& zero) {
    Frag16x16 f, f_hi;
    images(w, f, f_hi);
    if constexpr (W == WType::U4B8 && !bf16) {
      // 1024 + q - 1032 = q - 8;  (1024 + 16 q) / 16 - 72 = q - 8.
      f.r[0] = N::sub(f.r[0], 0x64086408u);
      f.r[1] = N::sub(f.r[1], 0x64086408u);
      f.r[2] = N::fma(f.r[2], 0x2c002c00u, 0xd480d480u);
      f.r[3] = N::fma(f.r[3], 0x2c002c00u, 0xd480d480u);
    } else if constexpr (W == WType::U4B8) {
#pragma unroll
      for (int i = 0; i < 4; ++i) f.r[i] = N::sub(f.r[i], 0x43084308u);  // 128 + q - 136
    } else if constexpr (W == WType::U4) {
#pragma unroll
      for (int i = 0; i < 4; ++i) f.r[i] = N::sub(f.r[i], zero.r[i]);
    } else if constexpr (W == WType::U8B128 && !bf16) {
#pragma unroll
      for (int i = 0; i < 4; ++i) f.r[i] = N::sub(f.r[i], 0x64806480u);  // 1024 + q - 1152
    } else if constexpr (W == WType::U8B128) {
      // (2048 + 16 hi) - 2304 + (128 + lo) = q - 128, every step exact in bf16.
#pragma unroll
      for (int i = 0; i < 4; ++i) f.r[i] = N::add(N::sub(f_hi.r[i], 0x45104510u), f.r[i]);
    } else if constexpr (W == WType::FE2M1) {
#pragma unroll
      for (int i = 0; i < 4; ++i) f.r[i] = N::mul(f.r[i], 0x7e807e80u);  // value * 2^-126 * 2^126, exact
    }
    return f;
  }

  // Multiplies a fragment by {scale(c), scale(c+8)}.
  __device__ static void scale(Frag16x16& f, uint32_t pair) {
    f.r[0] = N::mul_low(f.r[0], pair);
    f.r[1] = N::mul_high(f.r[1], pair);
    f.r[2] = N::mul_low(f.r[2], pair);
    f.r[3] = N::mul_high(f.r[3], pair);
  }

  // Multiplies each register by its own scale pair.
  __device__ static void scale(Frag16x16& f, const Frag16x16& s) {
#pragma unroll
    for (int i = 0; i < 4; ++i) f.r[i] = N::mul(f.r[i], s.r[i]);
  }

 private:
  // Two E2M1 codes placed as bf16 bits (sign 15, e1 e0 m 8..6): value *
  // 2^-126 for normals and subnormals alike. `nibbles` holds one code per
  // half, alone (the rest masked off), so one integer multiply by `copies`
  // (two powers of two, 6 bits apart) leaves two copies that never overlap:
  // one with e1 e0 m at bits 8..6, one with the sign at bit 15; a mask keeps
  // those.
  __device__ static uint32_t fp4_pair(uint32_t nibbles, uint32_t copies) {
    return (nibbles * copies) & 0x81c081c0u;
  }

  // E4M3 bytes 1 and 3 of `w` -> two fp16/bf16 values equal to value / 256:
  // the sign stays, exponent and mantissa move to the top of the field, which
  // is exact for normals and subnormals alike. The bf16 image is value / 2^120
  // and is brought to value / 256 by one exact multiplication.
  __device__ static uint32_t fp8_odd(uint32_t w) {
    if constexpr (!bf16) return ptx::lop3<kLop3Or>(w >> 1, 0x3f803f80u, w & 0x80008000u);
    const uint32_t image = ptx::lop3<kLop3Or>(w >> 4, 0x07f007f0u, w & 0x80008000u);
    return N::mul(image, 0x77807780u);  // 2^112
  }
};

// A lane's weight words of one 16-deep k step of its chunk (its Marlin unit:
// Words 16-byte pieces), tile t owning words [t * Words, (t + 1) * Words).
template <int Words>
__device__ __forceinline__ void unit_words(const int4* src, uint32_t (&w)[4 * Words]) {
#pragma unroll
  for (int i = 0; i < Words; ++i) {
    const int4 v = src[i];
    w[4 * i] = v.x;
    w[4 * i + 1] = v.y;
    w[4 * i + 2] = v.z;
    w[4 * i + 3] = v.w;
  }
}

// Exact values of Tiles tiles (tile0 on) of a 16-deep step whose fragment
// rows k, k+1, k+8, k+9 belong to groups of their own (a K shard of an
// act-order layer): sp[j][h] is the pair {scale(c), scale(c+8)} of tile
// tile0 + h for row j's group, zw[j] that group's zero-point word.
template <class F, int Tiles>
__device__ __forceinline__ void dequant_row_groups(const uint32_t* w, const uint32_t (&sp)[4][Tiles],
                                                   const uint32_t (&zw)[4], int tile0, Frag16x16 (&f)[Tiles]) {
#pragma unroll
  for (int h = 0; h < Tiles; ++h) {
    Frag16x16 zero{};
    if constexpr (F::zero_points)
      zero = row_pairs(F::zero_pair(zw[0], tile0 + h), F::zero_pair(zw[1], tile0 + h), F::zero_pair(zw[2], tile0 + h),
                       F::zero_pair(zw[3], tile0 + h));
    f[h] = F::dequant(w + h * F::words, zero);
    F::scale(f[h], row_pairs(sp[0][h], sp[1][h], sp[2][h], sp[3][h]));
  }
}

// Folds the fp32 partial sums of image products over one group window into
// the accumulators: removes the images' offset (the correction products, with
// zero points weighed per column by E + z) and applies the window's scale
// pairs (tile t: columns c, c + 8; F::N::kOne pairs where the epilogue scales).
// CorrectionInPartials: the partials started from the correction products.
// Bare: F::bare() images, whose zero-point weight is z, not E + z.
template <class F, int M8, bool CorrectionInPartials = false, bool Bare = false>
__device__ __forceinline__ void fold_images(float (&acc)[4][M8][4], const float (&part)[4][M8][4],
                                            const float (&corr)[M8][4], const uint32_t (&scale_pairs)[4],
                                            uint32_t zero_word) {
  // Zero points: one FMA per value takes the column's E + z times the
  // correction sums off the partial (one rounding), one more applies the
  // scale; no per-column s (E + z) products.
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    const float2 s = F::N::to_float2(scale_pairs[t]);
    [[maybe_unused]] float2 ez;
    if constexpr (F::zero_points) {
      ez = F::N::to_float2(F::zero_pair(zero_word, t));  // E + z
      if constexpr (Bare) {
        ez.x -= F::kZeroPairOffset;
        ez.y -= F::kZeroPairOffset;
      }
    }
#pragma unroll
    for (int j = 0; j < M8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float v = part[t][j][e];
        if constexpr (F::zero_points) v = fmaf(e < 2 ? ez.x : ez.y, corr[j][e], v);
        else if constexpr (F::const_correction && !CorrectionInPartials) v += corr[j][e];
        acc[t][j][e] = fmaf(e < 2 ? s.x : s.y, v, acc[t][j][e]);
      }
  }
}

// The same for exact values (dequant()): no offset to remove, only scales.
template <class F, int M8>
__device__ __forceinline__ void fold_scaled(float (&acc)[4][M8][4], const float (&part)[4][M8][4],
                                            const uint32_t (&scale_pairs)[4]) {
#pragma unroll
  for (int t = 0; t < 4; ++t) {
    const float2 s = F::N::to_float2(scale_pairs[t]);
#pragma unroll
    for (int j = 0; j < M8; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[t][j][e] = fmaf(e < 2 ? s.x : s.y, part[t][j][e], acc[t][j][e]);
  }
}

}  // namespace ferrum
