package par

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
)

func TestForRunsEveryTaskOnce(t *testing.T) {
	for _, workers := range []int{-1, 0, 1, 3, 100} {
		var hits [50]atomic.Int32
		if err := For(context.Background(), len(hits), workers, func(i int) error {
			hits[i].Add(1)
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		for i := range hits {
			if n := hits[i].Load(); n != 1 {
				t.Fatalf("workers %d: task %d ran %d times", workers, i, n)
			}
		}
	}
}

func TestForReportsLowestFailedIndex(t *testing.T) {
	err := For(context.Background(), 20, 1, func(i int) error {
		if i >= 7 {
			return fmt.Errorf("task %d", i)
		}
		return nil
	})
	if err == nil || err.Error() != "task 7" {
		t.Fatalf("err = %v, want task 7", err)
	}
}

func TestForStopsOnCancel(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	ran := 0
	err := For(ctx, 10, 1, func(int) error { ran++; return nil })
	if !errors.Is(err, context.Canceled) || ran != 0 {
		t.Fatalf("err = %v after %d tasks, want context.Canceled after none", err, ran)
	}
}
