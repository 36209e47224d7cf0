//go:build amd64 && !purego

#include "textflag.h"

// AVX2 row kernels for BFP pack and unpack. They compute exactly what
// kernel_go.go computes; see that file for the element rule.
//
// Pack, per group of 16 float32 (two YMM halves):
//   e = exponent field; E = max e (horizontal max, broadcast);
//   M = hidden bit | fraction, or 0 when e == 0;
//   A = M >> (E - e)  (VPSRLVD gives 0 for counts above 31);
//   q = min((A + half-1 + ((A >> S) & 1)) >> S, 2^W-1)  (ties to even);
//   code = q | sign<<W when q != 0.
//
// Register use in the pack kernels:
//   SI src, DX tiles left, CX groups per tile, R8/R9 exponent/code pointer
//   of the current tile, R11/DI of the current group, BX groups left in the
//   tile, R10 tile stride, R12/R13 face strides, AX scratch.
//   Y15 0xff, Y14 0x7fffff, Y13 0x800000, Y12 half-1, Y11 1, Y10 2^W-1,
//   Y9 1<<W, Y8 0, Y7 byte multipliers (BFP4, BFP2).

// ENC encodes the 8 values in x whose exponent fields are in e against the
// shared exponent in Y4; the codes replace x. Clobbers e, Y5, Y6.
#define ENC(x, e, S, SH) \
	VPCMPEQD Y8, e, Y5; \
	VPSUBD   e, Y4, e; \
	VPAND    Y14, x, Y6; \
	VPOR     Y13, Y6, Y6; \
	VPANDN   Y6, Y5, Y6; \
	VPSRLVD  e, Y6, Y6; \
	VPSRLD   $S, Y6, Y5; \
	VPAND    Y11, Y5, Y5; \
	VPADDD   Y5, Y6, Y6; \
	VPADDD   Y12, Y6, Y6; \
	VPSRLD   $S, Y6, Y6; \
	VPMINUD  Y10, Y6, Y6; \
	VPSRLD   $SH, x, Y5; \
	VPAND    Y9, Y5, Y5; \
	VPCMPEQD Y8, Y6, e; \
	VPANDN   Y5, e, Y5; \
	VPOR     Y5, Y6, x

// GROUP loads the group at SI, stores its shared exponent byte at R11 and
// leaves the 16 codes as bytes in X2.
#define GROUP(S, SH) \
	VMOVDQU     (SI), Y0; \
	VMOVDQU     32(SI), Y1; \
	VPSRLD      $23, Y0, Y2; \
	VPAND       Y15, Y2, Y2; \
	VPSRLD      $23, Y1, Y3; \
	VPAND       Y15, Y3, Y3; \
	VPMAXUD     Y2, Y3, Y4; \
	VPERM2I128  $1, Y4, Y4, Y5; \
	VPMAXUD     Y5, Y4, Y4; \
	VPSHUFD     $0x4E, Y4, Y5; \
	VPMAXUD     Y5, Y4, Y4; \
	VPSHUFD     $0xB1, Y4, Y5; \
	VPMAXUD     Y5, Y4, Y4; \
	VMOVD       X4, AX; \
	MOVB        AL, (R11); \
	ENC(Y0, Y2, S, SH); \
	ENC(Y1, Y3, S, SH); \
	VPACKUSDW   Y1, Y0, Y2; \
	VPERMQ      $0xD8, Y2, Y2; \
	VEXTRACTI128 $1, Y2, X3; \
	VPACKUSWB   X3, X2, X2

#define BCAST(imm, y, x) \
	MOVL         $imm, AX; \
	VMOVD        AX, x; \
	VPBROADCASTD x, y

#define PACKSETUP(HALF, MAXQ, SIGN) \
	MOVQ src+0(FP), SI; \
	MOVQ nt+8(FP), DX; \
	MOVQ fc+16(FP), CX; \
	MOVQ exp+24(FP), R8; \
	MOVQ mant+32(FP), R9; \
	MOVQ tb+40(FP), R10; \
	MOVQ se+48(FP), R12; \
	MOVQ sm+56(FP), R13; \
	BCAST(0xff, Y15, X15); \
	BCAST(0x7fffff, Y14, X14); \
	BCAST(0x800000, Y13, X13); \
	BCAST(HALF, Y12, X12); \
	BCAST(1, Y11, X11); \
	BCAST(MAXQ, Y10, X10); \
	BCAST(SIGN, Y9, X9); \
	VPXOR Y8, Y8, Y8

// Loop heads and tails shared by the pack and unpack kernels.
#define TILEHEAD \
	MOVQ R8, R11; \
	MOVQ R9, DI; \
	MOVQ CX, BX

#define GROUPTAIL \
	ADDQ $64, SI; \
	ADDQ R12, R11; \
	ADDQ R13, DI; \
	DECQ BX

#define TILETAIL \
	ADDQ R10, R8; \
	ADDQ R10, R9; \
	DECQ DX

// func packRow8AVX2(src *float32, nt, fc int, exp, mant *byte, tb, se, sm int)
TEXT ·packRow8AVX2(SB), NOSPLIT, $0-64
	PACKSETUP(0xffff, 127, 128)
p8tile:
	TILEHEAD
p8group:
	GROUP(17, 24)
	VMOVDQU X2, (DI)
	GROUPTAIL
	JNZ p8group
	TILETAIL
	JNZ p8tile
	VZEROUPPER
	RET

// func packRow4AVX2(src *float32, nt, fc int, exp, mant *byte, tb, se, sm int)
TEXT ·packRow4AVX2(SB), NOSPLIT, $0-64
	PACKSETUP(0xfffff, 7, 8)
	BCAST(0x10011001, Y7, X7)
p4tile:
	TILEHEAD
p4group:
	GROUP(21, 28)
	VPMADDUBSW X7, X2, X2 // c[2k] + 16*c[2k+1]
	VPACKUSWB  X2, X2, X2
	VMOVQ      X2, (DI)
	GROUPTAIL
	JNZ p4group
	TILETAIL
	JNZ p4tile
	VZEROUPPER
	RET

// func packRow2AVX2(src *float32, nt, fc int, exp, mant *byte, tb, se, sm int)
TEXT ·packRow2AVX2(SB), NOSPLIT, $0-64
	PACKSETUP(0x3fffff, 1, 2)
	BCAST(0x04010401, Y7, X7)
p2tile:
	TILEHEAD
p2group:
	GROUP(23, 30)
	VPMADDUBSW X7, X2, X2 // words: c[2k] + 4*c[2k+1]
	VPSRLD     $12, X2, X3
	VPOR       X3, X2, X2 // low byte of dword j: four codes
	VPAND      X15, X2, X2
	VPACKUSDW  X2, X2, X2
	VPACKUSWB  X2, X2, X2
	VMOVD      X2, (DI)
	GROUPTAIL
	JNZ p2group
	TILETAIL
	JNZ p2tile
	VZEROUPPER
	RET

// Unpack: value = float(magnitude) * 2^(E-127-(W-1)) with the code's sign
// ORed in, exact for W <= E <= 254. Groups with other exponents are
// skipped and counted; the Go caller decodes them with the exact rule.
//
// Register use: R8/R9 tile exponent/code pointers, R11/DI group pointers,
// SI dst, DX tiles left, CX groups per tile, BX groups left in the tile,
// R10 tile stride, R12/R13 face strides, R14 skipped groups, AX scratch.
// Y15 2^W-1, Y14 sign bit, Y13/Y11 per-lane shift counts, Y12 scale.

DATA shift4<>+0(SB)/4, $0
DATA shift4<>+4(SB)/4, $4
DATA shift4<>+8(SB)/4, $8
DATA shift4<>+12(SB)/4, $12
DATA shift4<>+16(SB)/4, $16
DATA shift4<>+20(SB)/4, $20
DATA shift4<>+24(SB)/4, $24
DATA shift4<>+28(SB)/4, $28
GLOBL shift4<>(SB), RODATA|NOPTR, $32

DATA shift2<>+0(SB)/4, $0
DATA shift2<>+4(SB)/4, $2
DATA shift2<>+8(SB)/4, $4
DATA shift2<>+12(SB)/4, $6
DATA shift2<>+16(SB)/4, $8
DATA shift2<>+20(SB)/4, $10
DATA shift2<>+24(SB)/4, $12
DATA shift2<>+28(SB)/4, $14
DATA shift2<>+32(SB)/4, $16
DATA shift2<>+36(SB)/4, $18
DATA shift2<>+40(SB)/4, $20
DATA shift2<>+44(SB)/4, $22
DATA shift2<>+48(SB)/4, $24
DATA shift2<>+52(SB)/4, $26
DATA shift2<>+56(SB)/4, $28
DATA shift2<>+60(SB)/4, $30
GLOBL shift2<>(SB), RODATA|NOPTR, $64

// DEC turns the 8 codes in y into float32 values in place. Clobbers Y2.
#define DEC(y, SH) \
	VPAND     Y15, y, Y2; \
	VCVTDQ2PS Y2, Y2; \
	VMULPS    Y12, Y2, Y2; \
	VPSLLD    $SH, y, y; \
	VPAND     Y14, y, y; \
	VPOR      Y2, y, y

#define UNPACKSETUP(MAXQ) \
	MOVQ exp+0(FP), R8; \
	MOVQ mant+8(FP), R9; \
	MOVQ nt+16(FP), DX; \
	MOVQ fc+24(FP), CX; \
	MOVQ tb+32(FP), R10; \
	MOVQ se+40(FP), R12; \
	MOVQ sm+48(FP), R13; \
	MOVQ dst+56(FP), SI; \
	XORQ R14, R14; \
	BCAST(MAXQ, Y15, X15); \
	BCAST(0x80000000, Y14, X14)

// SCALE loads the group's exponent, jumps to skip for E < W or E = 255,
// and otherwise broadcasts 2^(E-127-(W-1)) into Y12.
#define SCALE(W, skip) \
	MOVBLZX (R11), AX; \
	CMPL    AX, $W; \
	JB      skip; \
	CMPL    AX, $255; \
	JEQ     skip; \
	SUBL    $(W-1), AX; \
	SHLL    $23, AX; \
	VMOVD   AX, X12; \
	VPBROADCASTD X12, Y12

// STORE writes the 16 decoded values in Y0, Y1 to SI, with non-temporal
// stores when the caller asked for streaming (SI is then 32-byte aligned).
// The jumps count instructions: JNE skips the two ordinary stores and lands
// on JEQ, which (flags unchanged) falls through to the streaming stores;
// JEQ skips those after the ordinary stores.
#define STORE \
	CMPB    stream+64(FP), $0; \
	JNE     3(PC); \
	VMOVUPS Y0, (SI); \
	VMOVUPS Y1, 32(SI); \
	JEQ     3(PC); \
	VMOVNTPS Y0, (SI); \
	VMOVNTPS Y1, 32(SI)

#define UNPACKEND \
	SFENCE; \
	VZEROUPPER; \
	MOVQ R14, ret+72(FP); \
	RET

// func unpackRow8AVX2(exp, mant *byte, nt, fc, tb, se, sm int, dst *float32, stream bool) int
TEXT ·unpackRow8AVX2(SB), NOSPLIT, $0-80
	UNPACKSETUP(127)
u8tile:
	TILEHEAD
u8group:
	SCALE(7, u8skip)
	VPMOVZXBD (DI), Y0
	VPMOVZXBD 8(DI), Y1
	DEC(Y0, 24)
	DEC(Y1, 24)
	STORE
	JMP       u8next
u8skip:
	INCQ R14
u8next:
	GROUPTAIL
	JNZ u8group
	TILETAIL
	JNZ u8tile
	UNPACKEND

// func unpackRow4AVX2(exp, mant *byte, nt, fc, tb, se, sm int, dst *float32, stream bool) int
TEXT ·unpackRow4AVX2(SB), NOSPLIT, $0-80
	UNPACKSETUP(7)
	VMOVDQU shift4<>(SB), Y13
u4tile:
	TILEHEAD
u4group:
	SCALE(3, u4skip)
	VPBROADCASTD (DI), Y0
	VPBROADCASTD 4(DI), Y1
	VPSRLVD   Y13, Y0, Y0
	VPSRLVD   Y13, Y1, Y1
	DEC(Y0, 28)
	DEC(Y1, 28)
	STORE
	JMP       u4next
u4skip:
	INCQ R14
u4next:
	GROUPTAIL
	JNZ u4group
	TILETAIL
	JNZ u4tile
	UNPACKEND

// func unpackRow2AVX2(exp, mant *byte, nt, fc, tb, se, sm int, dst *float32, stream bool) int
TEXT ·unpackRow2AVX2(SB), NOSPLIT, $0-80
	UNPACKSETUP(1)
	VMOVDQU shift2<>(SB), Y13
	VMOVDQU shift2<>+32(SB), Y11
u2tile:
	TILEHEAD
u2group:
	SCALE(1, u2skip)
	VPBROADCASTD (DI), Y1
	VPSRLVD   Y13, Y1, Y0
	VPSRLVD   Y11, Y1, Y1
	DEC(Y0, 30)
	DEC(Y1, 30)
	STORE
	JMP       u2next
u2skip:
	INCQ R14
u2next:
	GROUPTAIL
	JNZ u2group
	TILETAIL
	JNZ u2tile
	UNPACKEND
