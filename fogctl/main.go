// Command fogctl is the PoP operators' CLI of fogdeploy.
package main

import (
	"os"

	"github.com/fogdeploy/fogdeploy/fogctl/cli"
)

func main() { os.Exit(cli.Main(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)) }
