package layering

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// MaxNameLen bounds environment, app and image names.
const MaxNameLen = 63

var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9._-]*[a-z0-9])?$`)

// ValidateName checks a user-given name (environment, app, node). field
// names the input in the error ("name", "--node", "spec.app").
func ValidateName(field, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%s is empty: give a name of lower-case letters, digits, '.', '_' or '-': %w", field, ErrInvalid)
	case len(name) > MaxNameLen:
		return fmt.Errorf("%s %q is %d characters long: use at most %d: %w", field, name, len(name), MaxNameLen, ErrInvalid)
	case !nameRE.MatchString(name):
		return fmt.Errorf("%s %q may only hold lower-case letters, digits, '.', '_' and '-', and must start and end with a letter or digit: %w", field, name, ErrInvalid)
	}
	return nil
}

// ParseSize parses a size such as "2G", "512M", "1.5GiB" or "1048576" into
// bytes. Units are binary (K = 1024). It rejects negative, zero and
// unparsable values.
func ParseSize(field, s string) (int64, error) {
	orig := s
	s = strings.TrimSpace(strings.ToUpper(s))
	s = strings.TrimSuffix(strings.TrimSuffix(s, "B"), "I")
	mult := int64(1)
	if n := len(s); n > 0 {
		switch s[n-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		case 'T':
			mult = 1 << 40
		}
		if mult != 1 {
			s = s[:n-1]
		}
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || f != f {
		return 0, fmt.Errorf("%s %q is not a size: use a number with an optional unit, e.g. 512M or 2G: %w", field, orig, ErrInvalid)
	}
	if f <= 0 {
		return 0, fmt.Errorf("%s %q must be positive: %w", field, orig, ErrInvalid)
	}
	if f*float64(mult) > float64(1<<50) {
		return 0, fmt.Errorf("%s %q is larger than 1 PiB: %w", field, orig, ErrInvalid)
	}
	return int64(f * float64(mult)), nil
}

// FormatSize renders bytes with a binary unit.
func FormatSize(b int64) string {
	const unit = 1024
	if b < unit {
		return fmt.Sprintf("%d B", b)
	}
	div, exp := int64(unit), 0
	for n := b / unit; n >= unit; n /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(b)/float64(div), "KMGTPE"[exp])
}
