package evaluation

import (
	"errors"
	"fmt"
	"regexp"
	"strconv"
)

// ErrParse is wrapped by the parsers' errors.
var ErrParse = errors.New("cannot parse")

// AB is what one run of ab (ApacheBench) reported.
type AB struct {
	Complete int
	Failed   int
	// Non2xx counts responses that were not 2xx.
	Non2xx int
	RPS    float64
	// MeanMS is ab's mean time per request (ms): from its send to its
	// answer, at the run's concurrency.
	MeanMS float64
}

var (
	abRPS      = regexp.MustCompile(`(?m)^Requests per second:\s+([0-9.]+)`)
	abComplete = regexp.MustCompile(`(?m)^Complete requests:\s+([0-9]+)`)
	abFailed   = regexp.MustCompile(`(?m)^Failed requests:\s+([0-9]+)`)
	abNon2xx   = regexp.MustCompile(`(?m)^Non-2xx responses:\s+([0-9]+)`)
	abMean     = regexp.MustCompile(`(?m)^Time per request:\s+([0-9.]+) \[ms\] \(mean\)$`)
)

// ParseAB reads the summary ab prints.
func ParseAB(out string) (AB, error) {
	var r AB
	m := abRPS.FindStringSubmatch(out)
	if m == nil {
		return r, fmt.Errorf("%w ab output: no \"Requests per second\" line", ErrParse)
	}
	var err error
	if r.RPS, err = strconv.ParseFloat(m[1], 64); err != nil {
		return r, fmt.Errorf("%w ab requests per second %q", ErrParse, m[1])
	}
	for _, f := range []struct {
		re  *regexp.Regexp
		dst *int
	}{{abComplete, &r.Complete}, {abFailed, &r.Failed}, {abNon2xx, &r.Non2xx}} {
		if m := f.re.FindStringSubmatch(out); m != nil {
			*f.dst, _ = strconv.Atoi(m[1])
		}
	}
	if m := abMean.FindStringSubmatch(out); m != nil {
		r.MeanMS, _ = strconv.ParseFloat(m[1], 64)
	}
	return r, nil
}
