package tokenizer

import (
	"errors"
	"testing"
)

func TestRenderChat(t *testing.T) {
	text, spans, err := RenderChat([]Message{
		{Role: "system", Content: "S"}, {Role: "user", Content: "U"}, {Role: "assistant", Content: "A1"},
		{Role: "user", Content: ""}, {Role: "assistant", Content: "A2\n"},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\nA1<|im_end|>\n" +
		"<|im_start|>user\n<|im_end|>\n<|im_start|>assistant\nA2\n<|im_end|>\n"
	if text != want {
		t.Fatalf("rendered %q\nwant %q", text, want)
	}
	if len(spans) != 2 || text[spans[0].Start:spans[0].End] != "A1<|im_end|>" || text[spans[1].Start:spans[1].End] != "A2\n<|im_end|>" {
		t.Fatalf("assistant spans %v", spans)
	}
	for _, bad := range [][]Message{
		nil,
		{{Role: "tool", Content: "x"}},
		{{Role: "user", Content: "x"}, {Role: "system", Content: "late"}},
	} {
		if _, _, err := RenderChat(bad); !errors.Is(err, ErrChat) {
			t.Errorf("%v: error %v", bad, err)
		}
	}
}

func TestEncodeChatMask(t *testing.T) {
	for _, tok := range []*Tokenizer{load(t, "models", "tiny-qwen36-trained"), load(t, "tokenizer", "qwen3")} {
		msgs := []Message{{Role: "user", Content: "Why?"}, {Role: "assistant", Content: "\n\nBecause, naïvely."}, {Role: "user", Content: "Ok"}, {Role: "assistant", Content: "Yes"}}
		ids, mask, err := tok.EncodeChat(msgs)
		if err != nil {
			t.Fatal(err)
		}
		text, _, _ := RenderChat(msgs)
		if want := tok.Encode(text); len(want) != len(ids) {
			t.Fatalf("EncodeChat ids differ from Encode of the rendered text")
		}
		var in []int
		for i, m := range mask {
			if m {
				in = append(in, ids[i])
			}
		}
		got, _ := tok.Decode(in)
		// The leading "\n\n" of the first answer is a pre-token starting in
		// the role line ("assistant\n\n\n"), so it is not an assistant token.
		if got != "Because, naïvely.<|im_end|>Yes<|im_end|>" {
			t.Fatalf("%s: assistant tokens decode to %q", tok.Pattern(), got)
		}
	}
}
