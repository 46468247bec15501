// Package hint attaches a one-line hint for the user to an error. fogctl
// prints it under the error, and the hook API returns it as "hint".
package hint

import "errors"

// Error is an error with a hint; it unwraps to the error.
type Error struct {
	Err  error
	Hint string
}

func (e *Error) Error() string { return e.Err.Error() }
func (e *Error) Unwrap() error { return e.Err }

// UserHint returns the hint (the method fogctl and the hook API look for).
func (e *Error) UserHint() string { return e.Hint }

// With wraps err with a hint; a nil err stays nil.
func With(err error, hint string) error {
	if err == nil {
		return nil
	}
	return &Error{Err: err, Hint: hint}
}

// Of returns the first hint in err's chain, from any error that has a
// UserHint method, or "".
func Of(err error) string {
	var h interface{ UserHint() string }
	if errors.As(err, &h) {
		return h.UserHint()
	}
	return ""
}

// Sentence is the error and its hint on one line, for logs and status
// records: "cause (hint: what to do)".
func Sentence(err error) string {
	if err == nil {
		return ""
	}
	if h := Of(err); h != "" {
		return err.Error() + " (hint: " + h + ")"
	}
	return err.Error()
}
