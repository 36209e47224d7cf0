package build

import (
	"fmt"

	"github.com/ttquant/ttquant/internal/model"
	"github.com/ttquant/ttquant/safetensors"
)

// checkSourceConfig reads the config.json beside a source checkpoint,
// through the family, and checks it against the tensors' headers. A build
// needs it: the file is copied into the checkpoint as the model's
// description, so a missing, malformed or contradicting one is refused
// before any work. It is the build's one read of config.json: the
// calibration and the sequential pass take the Config it returns.
func checkSourceConfig(src string, m *safetensors.Model, fam model.Family) (*model.Config, error) {
	path := model.ConfigPath(src)
	cfg, err := fam.ReadConfig(path)
	if err != nil {
		return nil, fmt.Errorf("build: source %s needs a valid config.json (it describes the model and is copied into the checkpoint): %w", src, err)
	}
	if err := cfg.CheckTensors(m); err != nil {
		return nil, fmt.Errorf("build: %s does not describe the tensors of %s: %w", path, src, err)
	}
	return cfg, nil
}
