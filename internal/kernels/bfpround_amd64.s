//go:build amd64 && !purego

#include "textflag.h"

// Block floating point rounding (bfpround.go), eight values per YMM.
// Register use in both functions:
//   Y5 = 1, Y8 = w-1, X9 = w (shift count), X10 = s = 24-w (shift count),
//   Y11 = maxq = 2^w-1, Y12 = half = 2^(s-1)-1, Y14 = 0xffffff,
//   Y15 = 0x800000, Y4 = running minimum and Y13 = running maximum of the
//   exponents used.

// BFPROUND rounds the eight values whose bits are in Y0 onto the shared
// exponents in Y6 (scale bits (E-(w-1))<<23 in Y7); the result goes to Y1.
// Y0, Y2, Y3 are clobbered. The steps are those of bfpRoundOne.
#define BFPROUND \
	VPSLLD    $1, Y0, Y1   \ // ex = b>>23 & 0xff
	VPSRLD    $24, Y1, Y1  \
	VPSUBD    Y1, Y6, Y2   \ // t = E - ex
	VPSUBD    Y5, Y1, Y1   \ // shift = t | (ex-1)>>31<<5
	VPSRLD    $31, Y1, Y1  \
	VPSLLD    $5, Y1, Y1   \
	VPOR      Y2, Y1, Y1   \
	VPSRAD    $31, Y2, Y2  \ // sat = maxq when ex > E
	VPAND     Y11, Y2, Y2  \
	VPOR      Y15, Y0, Y3  \ // a = significand >> shift (0 from 32 on)
	VPAND     Y14, Y3, Y3  \
	VPSRLVD   Y1, Y3, Y3   \
	VPSRLD    X10, Y3, Y1  \ // m = min((a+half+(a>>s&1))>>s, maxq) | sat
	VPAND     Y5, Y1, Y1   \
	VPADDD    Y12, Y3, Y3  \
	VPADDD    Y1, Y3, Y3   \
	VPSRLD    X10, Y3, Y3  \
	VPMINUD   Y11, Y3, Y3  \
	VPOR      Y2, Y3, Y3   \
	VCVTDQ2PS Y3, Y1       \ // p = float32(m) * scale
	VMULPS    Y7, Y1, Y1   \
	VPADDD    Y11, Y3, Y3  \ // sign kept when m >= 1: (m+maxq)>>w
	VPSRLD    X9, Y3, Y3   \
	VPSRLD    $31, Y0, Y0  \
	VPAND     Y3, Y0, Y0   \
	VPSLLD    $31, Y0, Y0  \
	VPOR      Y0, Y1, Y1

// BFPSETUP loads the constants from the parameter block in BX.
#define BFPSETUP \
	VMOVD        0(BX), X9      \
	VMOVD        4(BX), X10     \
	VPBROADCASTD 8(BX), Y12     \
	VPBROADCASTD 12(BX), Y11    \
	VPBROADCASTD 16(BX), Y8     \
	MOVL         $1, AX         \
	VMOVD        AX, X5         \
	VPBROADCASTD X5, Y5         \
	MOVL         $0xffffff, AX  \
	VMOVD        AX, X14        \
	VPBROADCASTD X14, Y14       \
	MOVL         $0x800000, AX  \
	VMOVD        AX, X15        \
	VPBROADCASTD X15, Y15       \
	VPCMPEQD     Y4, Y4, Y4     \
	VPXOR        Y13, Y13, Y13

// BFPCHECK sets AX to 0xff when every exponent seen was in [w, 254].
#define BFPCHECK \
	VPCMPGTD  Y8, Y4, Y2   \ // min > w-1
	VPCMPEQD  Y3, Y3, Y3   \
	VPSRLD    $24, Y3, Y3  \
	VPCMPGTD  Y13, Y3, Y3  \ // 255 > max
	VPAND     Y2, Y3, Y3   \
	VMOVMSKPS Y3, AX

// func bfpRound32AVX2(x, q *float32, exps *uint8, n int, p *[5]uint32) bool
// n a positive multiple of 8; p = {w, s, half, maxq, w-1}.
TEXT ·bfpRound32AVX2(SB), NOSPLIT, $0-41
	MOVQ x+0(FP), SI
	MOVQ q+8(FP), DI
	MOVQ exps+16(FP), DX
	MOVQ n+24(FP), CX
	MOVQ p+32(FP), BX
	BFPSETUP
	SHRQ $3, CX
bfpvloop:
	VMOVDQU   (SI), Y0
	VPMOVZXBD (DX), Y6
	VPMINUD   Y6, Y4, Y4
	VPMAXUD   Y6, Y13, Y13
	VPSUBD    Y8, Y6, Y7
	VPSLLD    $23, Y7, Y7
	BFPROUND
	VMOVDQU   Y1, (DI)
	ADDQ      $32, SI
	ADDQ      $32, DI
	ADDQ      $8, DX
	DECQ      CX
	JNZ       bfpvloop
	BFPCHECK
	CMPL  AX, $0xff
	SETEQ ret+40(FP)
	VZEROUPPER
	RET

// GROUPMAXEXP loads the group of 16 values at (SI) into Y0 and Y1 and
// leaves the largest exponent field among them in every dword of X6.
// Y2, Y3 and Y7 are clobbered.
#define GROUPMAXEXP \
	VMOVDQU      (SI), Y0       \
	VMOVDQU      32(SI), Y1     \
	VPSLLD       $1, Y0, Y2     \
	VPSRLD       $24, Y2, Y2    \
	VPSLLD       $1, Y1, Y3     \
	VPSRLD       $24, Y3, Y3    \
	VPMAXUD      Y3, Y2, Y6     \
	VEXTRACTI128 $1, Y6, X7     \
	VPMAXUD      X7, X6, X6     \
	VPSHUFD      $0x4e, X6, X7  \
	VPMAXUD      X7, X6, X6     \
	VPSHUFD      $0xb1, X6, X7  \
	VPMAXUD      X7, X6, X6

// func bfpRoundGroups32AVX2(x, q *float32, n int, p *[5]uint32) bool
// n a positive multiple of 16; each group of 16 is rounded onto the
// largest exponent field among its values.
TEXT ·bfpRoundGroups32AVX2(SB), NOSPLIT, $0-33
	MOVQ x+0(FP), SI
	MOVQ q+8(FP), DI
	MOVQ n+16(FP), CX
	MOVQ p+24(FP), BX
	BFPSETUP
	SHRQ $4, CX
bfpgloop:
	GROUPMAXEXP
	VPBROADCASTD X6, Y6
	VPMINUD      Y6, Y4, Y4
	VPMAXUD      Y6, Y13, Y13
	VPSUBD       Y8, Y6, Y7
	VPSLLD       $23, Y7, Y7
	BFPROUND
	VMOVDQU      Y1, (DI)
	VMOVDQU      32(SI), Y0
	BFPROUND
	VMOVDQU      Y1, 32(DI)
	ADDQ         $64, SI
	ADDQ         $64, DI
	DECQ         CX
	JNZ          bfpgloop
	BFPCHECK
	CMPL  AX, $0xff
	SETEQ ret+32(FP)
	VZEROUPPER
	RET

// Dword order after VPACKUSDW/VPACKUSWB of four YMM registers.
DATA maxexpPerm<>+0(SB)/4, $0
DATA maxexpPerm<>+4(SB)/4, $4
DATA maxexpPerm<>+8(SB)/4, $1
DATA maxexpPerm<>+12(SB)/4, $5
DATA maxexpPerm<>+16(SB)/4, $2
DATA maxexpPerm<>+20(SB)/4, $6
DATA maxexpPerm<>+24(SB)/4, $3
DATA maxexpPerm<>+28(SB)/4, $7
GLOBL maxexpPerm<>(SB), RODATA|NOPTR, $32

// func maxExponents32AVX2(x *float32, exp *uint8, n32 int)
// exp[i] = max(exp[i], x[i]>>23 & 0xff) for i < n32 (a positive multiple
// of 32).
TEXT ·maxExponents32AVX2(SB), NOSPLIT, $0-24
	MOVQ    x+0(FP), SI
	MOVQ    exp+8(FP), DI
	MOVQ    n32+16(FP), CX
	VMOVDQU maxexpPerm<>(SB), Y7
	SHRQ    $5, CX
mxloop:
	VMOVDQU   (SI), Y0
	VMOVDQU   32(SI), Y1
	VMOVDQU   64(SI), Y2
	VMOVDQU   96(SI), Y3
	VPSLLD    $1, Y0, Y0
	VPSLLD    $1, Y1, Y1
	VPSLLD    $1, Y2, Y2
	VPSLLD    $1, Y3, Y3
	VPSRLD    $24, Y0, Y0
	VPSRLD    $24, Y1, Y1
	VPSRLD    $24, Y2, Y2
	VPSRLD    $24, Y3, Y3
	VPACKUSDW Y1, Y0, Y0
	VPACKUSDW Y3, Y2, Y2
	VPACKUSWB Y2, Y0, Y0
	VPERMD    Y0, Y7, Y0
	VPMAXUB   (DI), Y0, Y0
	VMOVDQU   Y0, (DI)
	ADDQ      $128, SI
	ADDQ      $32, DI
	DECQ      CX
	JNZ       mxloop
	VZEROUPPER
	RET

// func quantErr32AVX2(x, q, e *float32, acc *float64, n8 int, d, d2 float32)
// For i < n8 (a positive multiple of 8), δ = x[i]-q[i]: e[i] = δ/d,
// acc[i] += float64(δ*δ/d2) * 0.5 (the same as /2).
TEXT ·quantErr32AVX2(SB), NOSPLIT, $0-48
	MOVQ         x+0(FP), SI
	MOVQ         q+8(FP), DI
	MOVQ         e+16(FP), DX
	MOVQ         acc+24(FP), BX
	MOVQ         n8+32(FP), CX
	VBROADCASTSS d+40(FP), Y14
	VBROADCASTSS d2+44(FP), Y15
	MOVQ         $0x3fe0000000000000, AX
	MOVQ         AX, X13
	VBROADCASTSD X13, Y13
	SHRQ         $3, CX
qeloop:
	VMOVUPS      (SI), Y0
	VSUBPS       (DI), Y0, Y0
	VDIVPS       Y14, Y0, Y1
	VMOVUPS      Y1, (DX)
	VMULPS       Y0, Y0, Y2
	VDIVPS       Y15, Y2, Y2
	VCVTPS2PD    X2, Y3
	VEXTRACTF128 $1, Y2, X4
	VCVTPS2PD    X4, Y4
	VMULPD       Y13, Y3, Y3
	VMULPD       Y13, Y4, Y4
	VADDPD       (BX), Y3, Y3
	VADDPD       32(BX), Y4, Y4
	VMOVUPD      Y3, (BX)
	VMOVUPD      Y4, 32(BX)
	ADDQ         $32, SI
	ADDQ         $32, DI
	ADDQ         $32, DX
	ADDQ         $64, BX
	DECQ         CX
	JNZ          qeloop
	VZEROUPPER
	RET

// func groupMaxExponents32AVX2(x *float32, exps *uint8, ng int)
// exps[g] = the largest exponent field of x[16g : 16g+16], for g < ng
// (positive).
TEXT ·groupMaxExponents32AVX2(SB), NOSPLIT, $0-24
	MOVQ x+0(FP), SI
	MOVQ exps+8(FP), DI
	MOVQ ng+16(FP), CX
gmloop:
	GROUPMAXEXP
	VMOVD X6, AX
	MOVB  AL, (DI)
	ADDQ  $64, SI
	INCQ  DI
	DECQ  CX
	JNZ   gmloop
	VZEROUPPER
	RET

// BFPERRCAND adds the weighted squared error of rounding the eight values
// at (SI) onto the exponents in Y6 to the eight float64 sums at (ACC), in
// the lanes whose exponent is in [w, 254]; the other sums are kept. Y4 =
// the weight. Y0-Y3, Y7 are clobbered. The error is taken in float64 as
// the Go twin takes it: (wt*d)*d with d = float64(x) - float64(q).
#define BFPERRCAND(ACC) \
	VPSUBD       Y8, Y6, Y7    \ // scale bits (E-(w-1))<<23
	VPSLLD       $23, Y7, Y7   \
	VMOVDQU      (SI), Y0      \
	BFPROUND                   \ // q in Y1
	VPCMPGTD     Y8, Y6, Y2    \ // kept: E > w-1 and 255 > E
	VPCMPEQD     Y3, Y3, Y3    \
	VPSRLD       $24, Y3, Y3   \
	VPCMPGTD     Y6, Y3, Y3    \
	VPAND        Y3, Y2, Y2    \
	VCVTPS2PD    X1, Y3        \ // low four: acc + (wt*d)*d
	VCVTPS2PD    (SI), Y0      \
	VSUBPD       Y3, Y0, Y0    \
	VMULPD       Y4, Y0, Y3    \
	VMULPD       Y0, Y3, Y3    \
	VMOVUPD      (ACC), Y7     \
	VADDPD       Y3, Y7, Y3    \
	VPMOVSXDQ    X2, Y0        \
	VBLENDVPD    Y0, Y3, Y7, Y3 \
	VMOVUPD      Y3, (ACC)     \
	VEXTRACTF128 $1, Y1, X1    \ // high four
	VCVTPS2PD    X1, Y3        \
	VCVTPS2PD    16(SI), Y0    \
	VSUBPD       Y3, Y0, Y0    \
	VMULPD       Y4, Y0, Y3    \
	VMULPD       Y0, Y3, Y3    \
	VMOVUPD      32(ACC), Y7   \
	VADDPD       Y3, Y7, Y3    \
	VEXTRACTI128 $1, Y2, X2    \
	VPMOVSXDQ    X2, Y0        \
	VBLENDVPD    Y0, Y3, Y7, Y3 \
	VMOVUPD      Y3, 32(ACC)

// func bfpErrAcc32AVX2(x *float32, exps *uint8, n8 int, p *[5]uint32, wt float64, cands int, a0, a1, a2 *float64)
// For i < n8 (a positive multiple of 8) and k < cands (1 to 3), with
// E = exps[i]-k in [w, 254]: ak[i] += (wt*d)*d, d = x[i] - (x[i] rounded
// onto E).
TEXT ·bfpErrAcc32AVX2(SB), NOSPLIT, $0-72
	MOVQ         x+0(FP), SI
	MOVQ         exps+8(FP), DX
	MOVQ         n8+16(FP), CX
	MOVQ         p+24(FP), BX
	MOVQ         cands+40(FP), R9
	MOVQ         a0+48(FP), R10
	MOVQ         a1+56(FP), R11
	MOVQ         a2+64(FP), R12
	BFPSETUP
	VBROADCASTSD wt+32(FP), Y4
	SHRQ         $3, CX
bfpeloop:
	VPMOVZXBD    (DX), Y6
	BFPERRCAND(R10)
	CMPQ         R9, $1
	JEQ          bfpenext
	VPSUBD       Y5, Y6, Y6
	BFPERRCAND(R11)
	CMPQ         R9, $2
	JEQ          bfpenext
	VPSUBD       Y5, Y6, Y6
	BFPERRCAND(R12)
bfpenext:
	ADDQ         $32, SI
	ADDQ         $8, DX
	ADDQ         $64, R10
	ADDQ         $64, R11
	ADDQ         $64, R12
	DECQ         CX
	JNZ          bfpeloop
	VZEROUPPER
	RET
