package demo

import (
	"sync"
	"time"

	"github.com/ttquant/ttquant/emulator/eval"
	"github.com/ttquant/ttquant/manifest/build"
)

// Progress reports how far Run is, in one measure for the whole command so
// that there is one ETA: tokens through the model. The sequential GPTQ
// build runs every calibration token through two streams (the quantized
// one and the BF16 one the asymmetric fit reads), the evaluation every
// evaluation token through the BF16 model and each candidate; rounding to
// nearest and verifying run no tokens and count nothing. On the built-in
// model a build token and an evaluation token cost about the same (the
// build's GPTQ fits against the evaluation's LM head), so the rate of the
// steps done predicts the steps to come.
//
// Kind is "step" (Step began), "update" (inside a step), "layer" (the
// sequential build finished its pass over Layer) or "done".
type Progress struct {
	Kind        string
	Step, Steps int
	Name        string
	// Layer and LayerShare: the build's current layer and its share done,
	// -1 and 0 outside a build.
	Layer      int
	LayerShare float64
	// Done and Total are tokens through the model.
	Done, Total float64
	Elapsed     time.Duration

	eta   time.Duration
	etaOK bool
}

// ETA is the time left, false before any work is done.
func (p Progress) ETA() (time.Duration, bool) { return p.eta, p.etaOK }

// Share is Done over Total.
func (p Progress) Share() float64 {
	if p.Total <= 0 {
		return 0
	}
	return p.Done / p.Total
}

// stepNames are the demo's steps, in order; their token counts come from
// the options (tokens).
var stepNames = [...]string{"sequential GPTQ", "round to nearest", "verify", "evaluate"}

const (
	stepGPTQ = iota
	stepRTN
	stepVerify
	stepEval
)

// tokens is the work of each step.
func (o *Options) tokens() [len(stepNames)]float64 {
	var t [len(stepNames)]float64
	t[stepGPTQ] = 2 * float64(o.Sequences) * float64(o.SeqLen)
	t[stepEval] = (1 + 2) * float64(o.EvalSequences) * float64(o.EvalSeqLen)
	return t
}

// meter turns the steps' own progress into the command's; safe for
// concurrent use.
type meter struct {
	mu     sync.Mutex
	emit   func(Progress)
	now    func() time.Time
	start  time.Time
	tokens [len(stepNames)]float64
	total  float64
	step   int
	begun  time.Time // of the current step
}

func newMeter(o *Options) *meter {
	m := &meter{emit: o.Progress, now: time.Now, tokens: o.tokens(), step: -1}
	if m.emit == nil {
		m.emit = func(Progress) {}
	}
	for _, t := range m.tokens {
		m.total += t
	}
	m.start = m.now()
	return m
}

// begin starts step s.
func (m *meter) begin(s int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.step, m.begun = s, m.now()
	m.send("step", 0, -1, 0)
}

// send emits the command's progress with the current step share f done;
// the caller holds mu.
func (m *meter) send(kind string, f float64, layer int, layerShare float64) {
	now := m.now()
	p := Progress{Kind: kind, Step: m.step + 1, Steps: len(stepNames), Layer: layer, LayerShare: layerShare, Total: m.total, Elapsed: now.Sub(m.start)}
	if m.step >= 0 {
		p.Name = stepNames[m.step]
	}
	var before, after float64
	for i, t := range m.tokens {
		switch {
		case i < m.step:
			before += t
		case i > m.step:
			after += t
		}
	}
	cur := 0.0
	if m.step >= 0 && m.step < len(m.tokens) {
		cur = m.tokens[m.step]
	}
	p.Done = before + f*cur
	if kind == "done" {
		p.Done = m.total
	}
	// The current step's rest at its own rate once it has one; the steps
	// to come at the rate of everything done so far.
	stepTime := now.Sub(m.begun)
	rate := 0.0 // seconds per token
	if p.Done > 0 {
		rate = p.Elapsed.Seconds() / p.Done
	}
	switch {
	case kind == "done":
		p.etaOK = true
	case f > 0 && stepTime > 0:
		p.eta = time.Duration(float64(stepTime)*(1-f)/f) + time.Duration(after*rate*float64(time.Second))
		p.etaOK = true
	case rate > 0:
		p.eta = time.Duration((p.Total - p.Done) * rate * float64(time.Second))
		p.etaOK = true
	}
	m.emit(p)
}

// build follows a build step.
func (m *meter) build(ev build.ProgressEvent) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := 0.0
	if ev.WorkTotal > 0 {
		f = float64(ev.Work) / float64(ev.WorkTotal)
	}
	ls := 0.0
	if ev.LayerWorkTotal > 0 {
		ls = float64(ev.LayerWork) / float64(ev.LayerWorkTotal)
	}
	switch ev.Kind {
	case "file", "layer-start":
		m.send("update", f, ev.Layer, ls)
	case "layer":
		if m.step == stepGPTQ { // a pass over a layer is a milestone
			m.send("layer", f, ev.Layer, ls)
		} else {
			m.send("update", f, ev.Layer, ls)
		}
	}
}

// eval follows the evaluation step.
func (m *meter) eval(p eval.Progress) {
	m.mu.Lock()
	defer m.mu.Unlock()
	f := 0.0
	if p.Scored > 0 {
		f = float64(p.ScoredDone) / float64(p.Scored)
	}
	m.send("update", f, -1, 0)
}

// done ends the command's progress.
func (m *meter) done() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.send("done", 1, -1, 0)
}
