// Package manifest holds precision plans and the native checkpoint: its
// layout, its manifest, and the writing and verification of checkpoints.
package manifest
