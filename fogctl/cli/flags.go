package cli

import (
	"github.com/spf13/cobra"

	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// nodeFlag is a --node flag: a node's name, checked when it is given, so
// that an empty or malformed name is an error rather than "no node
// chosen" or a lookup that cannot succeed.
type nodeFlag string

func (n *nodeFlag) String() string { return string(*n) }

func (n *nodeFlag) Set(s string) error {
	if err := layering.ValidateName("--node", s); err != nil {
		return err
	}
	*n = nodeFlag(s)
	return nil
}

func (n *nodeFlag) Type() string { return "node" }

// addNodeFlag adds a checked --node flag that sets *p.
func addNodeFlag(cmd *cobra.Command, p *string, usage string) {
	cmd.Flags().Var((*nodeFlag)(p), "node", usage)
}
