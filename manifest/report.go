package manifest

// AddFailures appends failed checks found outside Verify (the comparison
// with the source checkpoint) and keeps the report sorted and its OK field
// in step.
func (r *VerifyReport) AddFailures(fs ...Failure) {
	r.Failures = append(r.Failures, fs...)
	finish(r)
}
