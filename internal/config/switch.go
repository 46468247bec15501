package config

import (
	"fmt"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Switch is a setting that is on or off: true or false in the config file
// and in its variable; "on" and "off" (and yes, no, 1, 0), as older
// configs wrote, are read too. A value that is none of these is reported
// by Validate, naming the setting.
type Switch struct {
	on  bool
	bad string
}

// On and Off are the two values of a Switch.
var (
	On  = Switch{on: true}
	Off = Switch{}
)

// IsOn reports whether the setting is on.
func (s Switch) IsOn() bool { return s.on }

// String is "true" or "false".
func (s Switch) String() string { return fmt.Sprint(s.on) }

// UnmarshalYAML reads a YAML boolean or one of the words Switch accepts.
func (s *Switch) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind != yaml.ScalarNode {
		*s = Switch{bad: "a " + kindName(n.Kind)}
		return nil
	}
	s.parse(n.Value)
	return nil
}

// MarshalYAML writes a YAML boolean.
func (s Switch) MarshalYAML() (any, error) { return s.on, nil }

func (s *Switch) parse(v string) {
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "true", "on", "yes", "1":
		*s = On
	case "false", "off", "no", "0":
		*s = Off
	default:
		*s = Switch{bad: v}
	}
}

// check returns the problem of a value that was neither on nor off.
func (s Switch) check(field string) error {
	if s.bad == "" {
		return nil
	}
	return fmt.Errorf("%s %q: use true or false", field, s.bad)
}

func kindName(k yaml.Kind) string {
	switch k {
	case yaml.MappingNode:
		return "mapping"
	case yaml.SequenceNode:
		return "list"
	}
	return "non-scalar value"
}
