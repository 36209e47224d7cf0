package tokenizer

import (
	"errors"
	"fmt"
	"strings"
)

// Message is one plain-text turn of a chat.
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// Chat roles EncodeChat renders.
const (
	RoleSystem    = "system"
	RoleUser      = "user"
	RoleAssistant = "assistant"
)

// ChatML markers.
const (
	imStart = "<|im_start|>"
	imEnd   = "<|im_end|>"
)

// ErrChat is wrapped by every error of RenderChat and EncodeChat.
var ErrChat = errors.New("chat not renderable")

// RenderChat returns the ChatML text of msgs, as Qwen chat templates write
// plain-text conversations:
//
//	<|im_start|>ROLE\nCONTENT<|im_end|>\n
//
// for every message in order, with nothing added before, between or after
// (no default system prompt, no generation prompt, no reasoning block). It
// also returns, per assistant message, the byte range of its content
// followed by its closing <|im_end|>: the part a model is scored on.
//
// Roles other than system, user and assistant are refused, as is a system
// message anywhere but first and an empty conversation.
func RenderChat(msgs []Message) (string, []Offset, error) {
	if len(msgs) == 0 {
		return "", nil, fmt.Errorf("%w: no messages", ErrChat)
	}
	var b strings.Builder
	var spans []Offset
	for i, m := range msgs {
		switch m.Role {
		case RoleSystem:
			if i != 0 {
				return "", nil, fmt.Errorf("%w: message %d: a system message must come first", ErrChat, i)
			}
		case RoleUser, RoleAssistant:
		default:
			return "", nil, fmt.Errorf("%w: message %d: role %q is not supported (system, user, assistant)", ErrChat, i, m.Role)
		}
		b.WriteString(imStart)
		b.WriteString(m.Role)
		b.WriteByte('\n')
		start := b.Len()
		b.WriteString(m.Content)
		b.WriteString(imEnd)
		if m.Role == RoleAssistant {
			spans = append(spans, Offset{start, b.Len()})
		}
		b.WriteByte('\n')
	}
	return b.String(), spans, nil
}

// EncodeChat renders msgs with RenderChat, encodes the text as Encode does
// (added tokens inside message content are recognised, as when Hugging Face
// tokenizes a rendered chat template), and returns the ids with the
// assistant mask: true for every token whose first byte lies in an
// assistant message's content or is its closing <|im_end|>.
func (t *Tokenizer) EncodeChat(msgs []Message) ([]int, []bool, error) {
	for _, tok := range []string{imStart, imEnd} {
		if _, ok := t.addedByID[tok]; !ok {
			return nil, nil, fmt.Errorf("%w: the tokenizer has no added token %s", ErrChat, tok)
		}
	}
	text, spans, err := RenderChat(msgs)
	if err != nil {
		return nil, nil, err
	}
	ids, offs := t.EncodeWithOffsets(text)
	mask := make([]bool, len(ids))
	k := 0
	for i, o := range offs {
		for k < len(spans) && spans[k].End <= o.Start {
			k++
		}
		mask[i] = k < len(spans) && o.Start >= spans[k].Start
	}
	return ids, mask, nil
}
