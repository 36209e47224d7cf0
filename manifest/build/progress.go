package build

import (
	"sync"
	"time"

	"github.com/ttquant/ttquant/internal/progress"
)

// ProgressEvent reports progress. Kind is "start", "file" (one output file
// finished or kept), "layer-start" (a sequential build began the pass over
// Layer), "layer" (Layer is finished: every file of it, and in a
// sequential build the pass over it) or "done".
//
// Work measures the whole build in one unit, for one ETA: in a GPTQ build
// with expert layers the GPTQ tasks (one per expert file of a GPTQ layer,
// and in a sequential build one more per layer for the rest of its pass),
// so that it advances inside a layer as each expert group is written;
// otherwise the bytes of the output files. WorkKept is the part of Work an
// earlier run had done (kept files, finished layers): it took no time in
// this run, so the rate leaves it out. LayerWork and LayerWorkTotal are the
// same measure within Layer.
type ProgressEvent struct {
	Kind       string
	File       string
	Layer      int
	Kept       bool
	FilesDone  int
	FilesTotal int
	BytesDone  int64
	BytesTotal int64
	Elapsed    time.Duration

	Work, WorkTotal, WorkKept int64
	LayerWork, LayerWorkTotal int64
}

// ETA is the time left at this run's rate, false before the run has done
// any work of its own.
func (ev ProgressEvent) ETA() (time.Duration, bool) {
	return progress.ETA(ev.Elapsed, float64(ev.Work), float64(ev.WorkKept), float64(ev.WorkTotal))
}

// tracker counts a build's work and emits its progress events; it is safe
// for concurrent use.
type tracker struct {
	mu     sync.Mutex
	emit   func(ProgressEvent)
	start  time.Time
	seq    bool             // "layer" comes from the sequential pass
	units  []int64          // per job, its Work
	isGPTQ map[int]bool     // jobs whose files a GPTQ layer task writes
	left   map[int]int      // per layer, files still to finish
	layer  map[int][2]int64 // per layer, work done and total
	ev     ProgressEvent
}

// begin sizes the build's work: jobs are its files, gptq the indices of
// the expert files of GPTQ layers, seqLayers the layers of a sequential
// pass (nil for other builds). It emits "start".
func (b *builder) begin(gptq map[int]bool, seqLayers []int) *tracker {
	t := &tracker{emit: b.progress, start: time.Now(), seq: seqLayers != nil, units: make([]int64, len(b.jobs)),
		isGPTQ: gptq, left: map[int]int{}, layer: map[int][2]int64{}}
	byWork := len(gptq) > 0 || seqLayers != nil
	for i, j := range b.jobs {
		if !b.owns(i) {
			continue // another worker's file
		}
		t.ev.FilesTotal++
		t.ev.BytesTotal += j.bytes
		t.left[j.layer]++
		switch {
		case !byWork:
			t.units[i] = j.bytes
		case gptq[i]:
			t.units[i] = 1
		}
		t.ev.WorkTotal += t.units[i]
		if j.layer >= 0 {
			lw := t.layer[j.layer]
			lw[1] += t.units[i]
			t.layer[j.layer] = lw
		}
	}
	for _, l := range seqLayers {
		lw := t.layer[l]
		lw[1]++
		t.layer[l] = lw
		t.ev.WorkTotal++
	}
	t.send("start", "", -1)
	return t
}

// send emits an event of the running totals; the caller holds mu (or is
// the only user).
func (t *tracker) send(kind, file string, layer int) {
	ev := t.ev
	ev.Kind, ev.File, ev.Layer, ev.Elapsed = kind, file, layer, time.Since(t.start)
	if lw, ok := t.layer[layer]; ok {
		ev.LayerWork, ev.LayerWorkTotal = lw[0], lw[1]
	}
	t.emit(ev)
}

func (t *tracker) add(layer int, units int64, kept bool) {
	t.ev.Work += units
	if kept {
		t.ev.WorkKept += units
	}
	if lw, ok := t.layer[layer]; ok {
		lw[0] += units
		t.layer[layer] = lw
	}
}

// file records that job i's file is finished (written, or kept from an
// earlier run).
func (t *tracker) file(i int, j *job, kept bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.ev.FilesDone++
	t.ev.BytesDone += j.bytes
	t.ev.Kept = kept
	t.add(j.layer, t.units[i], kept)
	t.send("file", j.file, j.layer)
	t.ev.Kept = false
	t.left[j.layer]--
	if !t.seq && j.layer >= 0 && t.left[j.layer] == 0 {
		t.send("layer", "", j.layer)
	}
}

// layerStart reports that the sequential pass began layer l.
func (t *tracker) layerStart(l int) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.send("layer-start", "", l)
}

// layerDone reports that the sequential pass finished layer l, in this
// run or (kept) in an earlier one.
func (t *tracker) layerDone(l int, kept bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.add(l, 1, kept)
	t.send("layer", "", l)
}

// done emits "done".
func (t *tracker) done() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.send("done", "", -1)
}
