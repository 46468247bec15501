// Package version carries the version stamped at build time.
package version

// Version is set with -ldflags "-X github.com/fogdeploy/fogdeploy/internal/version.Version=...".
var Version = "dev"

// String returns the version.
func String() string { return Version }
