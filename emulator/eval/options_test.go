package eval

import (
	"context"
	"testing"
)

// TestOptionsRefuseNegatives: a negative worker count or chunk is an error,
// not the default.
func TestOptionsRefuseNegatives(t *testing.T) {
	if _, err := NewScorer(8, []string{"a"}, ScorerOptions{Workers: -1}); err == nil {
		t.Error("NewScorer took -1 workers")
	}
	s, err := NewScorer(8, []string{"a"}, ScorerOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := Evaluate(context.Background(), s, nil, []Model{nil}, nil, EvalOptions{Chunk: -1}); err == nil {
		t.Error("Evaluate took a chunk of -1 positions")
	}
}
