package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/fogdeploy/fogdeploy/internal/docker"
	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// EnvImportOptions are the inputs of `fogctl env import`.
type EnvImportOptions struct {
	F           *Factory
	Name        string
	Dir         string
	Tar         string
	DockerImage string
	DockerHost  string
	Size        string
}

// NewCmdEnvImport builds `fogctl env import`.
func NewCmdEnvImport(f *Factory, runF func(context.Context, *EnvImportOptions) error) *cobra.Command {
	opts := &EnvImportOptions{F: f}
	cmd := &cobra.Command{
		Use:   "import NAME (--dir DIR | --tar FILE | --docker-image REF)",
		Short: "Create an environment from a root filesystem",
		Example: `  fogctl env import debian --dir /srv/rootfs/bookworm
  docker export c1 | fogctl env import app --tar -
  fogctl env import redis --docker-image redis-local:7 --size 1G`,
		Args: exactArgs(1, "one environment NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Name = args[0]
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return envImportRun(cmd.Context(), opts)
		},
	}
	cmd.Flags().StringVar(&opts.Dir, "dir", "", "directory holding the root filesystem")
	cmd.Flags().StringVar(&opts.Tar, "tar", "", "tar file of the root filesystem (- for standard input)")
	cmd.Flags().StringVar(&opts.DockerImage, "docker-image", "", "local Docker image to export")
	cmd.Flags().StringVar(&opts.DockerHost, "docker-host", "", "dockerd address (default: config, $DOCKER_HOST, or the dev-up dockerd)")
	cmd.Flags().StringVar(&opts.Size, "size", "", "image size, e.g. 2G (default: twice the content + 1 GiB, at least 2 GiB)")
	cmd.MarkFlagsMutuallyExclusive("dir", "tar", "docker-image")
	cmd.MarkFlagsOneRequired("dir", "tar", "docker-image")
	return cmd
}

func envImportRun(ctx context.Context, opts *EnvImportOptions) error {
	f := opts.F
	if err := layering.ValidateName("NAME", opts.Name); err != nil {
		return err
	}
	var size int64
	if opts.Size != "" {
		var err error
		if size, err = layering.ParseSize("--size", opts.Size); err != nil {
			return err
		}
	}
	src := layering.Source{Dir: opts.Dir}
	switch {
	case opts.Tar == "-":
		src.Tar = f.In
	case opts.Tar != "":
		fh, err := os.Open(opts.Tar)
		if err != nil {
			return fmt.Errorf("--tar: %w: %w", err, layering.ErrInvalid)
		}
		defer fh.Close()
		src.Tar = fh
	case opts.DockerImage != "":
		c, err := f.Config()
		if err != nil {
			return err
		}
		host := c.Docker.Host
		if opts.DockerHost != "" {
			host = opts.DockerHost
		}
		dc, err := docker.Connect(host)
		if err != nil {
			return err
		}
		defer dc.Close()
		src.DockerImage, src.Exporter = opts.DockerImage, docker.Exporter{Client: dc}
	}
	l, err := f.Layering(ctx)
	if err != nil {
		return err
	}
	defer l.Close()
	start := time.Now()
	env, err := l.Manager.Import(ctx, opts.Name, src, layering.ImportOptions{Size: size, Progress: f.Progress()})
	if err != nil {
		return err
	}
	info, err := l.Manager.Inspect(ctx, env.Name)
	if err != nil {
		return err
	}
	return printOut(f, info, func(w io.Writer) {
		fmt.Fprintf(w, "Imported %s as %s (%s, %s used) in %.1fs\n", info.Name, info.Ref, layering.FormatSize(info.Size), layering.FormatSize(info.Used), time.Since(start).Seconds())
	})
}
