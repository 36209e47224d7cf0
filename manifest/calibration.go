package manifest

import (
	"context"
	"errors"
	"regexp"
)

// compileLayerPattern compiles a --layers regular expression.
func compileLayerPattern(s string) (*regexp.Regexp, error) {
	return regexp.Compile(s)
}

// openCalibration prepares the Hessian source of a GPTQ build.
func (b *builder) openCalibration(ctx context.Context) error {
	if b.opt.Hessians != nil {
		b.hess = b.opt.Hessians
		b.calib = b.opt.CalibInfo
		return nil
	}
	if b.opt.Calib == "" {
		return errors.New("manifest: GPTQ needs a calibration store")
	}
	return errors.New("manifest: calibration stores are not supported yet")
}
