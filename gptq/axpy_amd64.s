//go:build amd64 && !purego

#include "textflag.h"

// func cpuid(eaxArg, ecxArg uint32) (eax, ebx, ecx, edx uint32)
TEXT ·cpuid(SB), NOSPLIT, $0-24
	MOVL eaxArg+0(FP), AX
	MOVL ecxArg+4(FP), CX
	CPUID
	MOVL AX, eax+8(FP)
	MOVL BX, ebx+12(FP)
	MOVL CX, ecx+16(FP)
	MOVL DX, edx+20(FP)
	RET

// func xgetbv() (eax, edx uint32)
TEXT ·xgetbv(SB), NOSPLIT, $0-8
	MOVL $0, CX
	XGETBV
	MOVL AX, eax+0(FP)
	MOVL DX, edx+4(FP)
	RET

// func axpySubAVX(a float32, x, y []float32)
// y[i] -= a·x[i] for i < len(x)&^15, the product rounded before the
// subtraction (VMULPS then VSUBPS, never fused).
TEXT ·axpySubAVX(SB), NOSPLIT, $0-56
	VBROADCASTSS a+0(FP), Y0
	MOVQ x_base+8(FP), SI
	MOVQ x_len+16(FP), CX
	MOVQ y_base+32(FP), DI
	SHRQ $4, CX
	JZ   done

loop:
	VMULPS  (SI), Y0, Y1
	VMULPS  32(SI), Y0, Y3
	VMOVUPS (DI), Y2
	VMOVUPS 32(DI), Y4
	VSUBPS  Y1, Y2, Y2
	VSUBPS  Y3, Y4, Y4
	VMOVUPS Y2, (DI)
	VMOVUPS Y4, 32(DI)
	ADDQ    $64, SI
	ADDQ    $64, DI
	DECQ    CX
	JNZ     loop

done:
	VZEROUPPER
	RET
