package manifest

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/ttquant/ttquant/bfp"
)

// TestTypedValues: StoredFormat, Method and Axis parse any case into one
// canonical spelling, that spelling is what JSON holds, and the zero value
// (or any other non-canonical value) cannot be written.
func TestTypedValues(t *testing.T) {
	for in, want := range map[string]StoredFormat{"BFP8_B": StoreBFP8, " bfp4_b ": StoreBFP4, "BFP2_b": StoreBFP2, "bf16": StoreBF16, "F32": StoreF32, "as_is": StoreAsIs} {
		if got, err := ParseStoredFormat(in); err != nil || got != want {
			t.Errorf("ParseStoredFormat(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"", "BFP16", "FP8"} {
		if _, err := ParseStoredFormat(bad); err == nil {
			t.Errorf("ParseStoredFormat(%q) accepted", bad)
		}
	}
	if m, err := ParseMethod(" GPTQ"); err != nil || m != MethodGPTQ {
		t.Errorf("ParseMethod: %q %v", m, err)
	}
	if a, err := bfp.ParseAxis("Output"); err != nil || a != bfp.AxisOutput {
		t.Errorf("ParseAxis: %q %v", a, err)
	}
	if _, err := ParseMethod("awq"); err == nil {
		t.Error("ParseMethod(awq) accepted")
	}
	if _, err := bfp.ParseAxis("rows"); err == nil {
		t.Error("bfp.ParseAxis(rows) accepted")
	}
	var zf StoredFormat
	var zm Method
	var za bfp.Axis
	if zf.Valid() || zm.Valid() || za.Valid() == nil || StoredFormat("BFP8_B").Valid() {
		t.Error("a zero or non-canonical value is valid")
	}
	if _, err := json.Marshal(RuleInfo{Pattern: "x", Format: "BFP8_B", Method: MethodRTN}); err == nil {
		t.Error("a rule with a non-canonical format was encoded")
	}
	b, err := json.Marshal(RuleInfo{Pattern: "x", Format: StoreBFP4, Method: MethodGPTQ, Axis: bfp.AxisInput})
	if err != nil || !strings.Contains(string(b), `"format":"BFP4_b"`) {
		t.Errorf("encoded rule %s, %v", b, err)
	}
	if f, ok := StoreBFP4.BFP(); !ok || f.String() != string(StoreBFP4) {
		t.Errorf("StoreBFP4.BFP() = %v, %v: the stored spelling must be bfp.Format's", f, ok)
	}
	if !StoreBF16.Lossless("BF16") || StoreBF16.Lossless("F32") || StoreBFP8.Lossless("BF16") {
		t.Error("Lossless")
	}
}
