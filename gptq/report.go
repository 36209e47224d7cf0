package gptq

// Report is the per-matrix summary of a Quantize call, with JSON field names
// for manifests and logs.
type Report struct {
	Name          string  `json:"name,omitempty"`
	Rows          int     `json:"rows"`
	Cols          int     `json:"cols"`
	Grid          string  `json:"grid"`
	ProxyLoss     float64 `json:"proxy_loss"`
	RTNProxyLoss  float64 `json:"rtn_proxy_loss"`
	LossRatio     float64 `json:"loss_ratio"` // ProxyLoss / RTNProxyLoss (0 when RTN's loss is 0)
	Error         float64 `json:"error"`
	PercDamp      float64 `json:"percdamp"`
	Damp          float64 `json:"damp"`
	DampIncreases int     `json:"damp_increases"`
	NoFeedback    bool    `json:"no_feedback,omitempty"`
	DeadCols      int     `json:"dead_cols"`
	Seconds       float64 `json:"seconds"`
}

// Report summarises r for the rows×cols matrix name quantized on grid g.
func (r *Result) Report(name string, rows, cols int, g Grid) Report {
	rep := Report{Name: name, Rows: rows, Cols: cols, ProxyLoss: r.ProxyLoss, RTNProxyLoss: r.RTNProxyLoss,
		Error: r.Error, PercDamp: r.PercDamp, Damp: r.Damp, DampIncreases: r.DampIncreases,
		NoFeedback: r.NoFeedback, DeadCols: r.DeadCols, Seconds: r.Duration.Seconds()}
	if g != nil {
		rep.Grid = g.String()
	}
	if r.RTNProxyLoss > 0 {
		rep.LossRatio = r.ProxyLoss / r.RTNProxyLoss
	}
	return rep
}
