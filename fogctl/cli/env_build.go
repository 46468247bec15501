package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	layering "github.com/fogdeploy/fogdeploy/rbd-layering"
)

// EnvBuildOptions are the inputs of `fogctl env build`.
type EnvBuildOptions struct {
	F          *Factory
	Name       string
	File       string
	ContextDir string
	NoCache    bool
	Quiet      bool
}

// NewCmdEnvBuild builds `fogctl env build`.
func NewCmdEnvBuild(f *Factory, runF func(context.Context, *EnvBuildOptions) error) *cobra.Command {
	opts := &EnvBuildOptions{F: f}
	cmd := &cobra.Command{
		Use:   "build NAME -f BUILDFILE",
		Short: "Build an environment from a build file, one RBD layer per step",
		Long: `Build an environment from a build file:

  FROM <environment>        the environment to start from (required, first)
  RUN <shell command>       run in a chroot of the mounted clone
  COPY <src> <dst>          copy from the build context (--context)
  ENV KEY=VALUE             set a variable for later steps and the app
  WORKDIR /dir              set the working directory

RUN and COPY each make a layer: a clone of the previous snapshot, changed,
then snapshotted and protected. A step with the same parent and the same
content is reused from cache.`,
		Example: `  fogctl env build redis -f configs/envs/redis.build
  fogctl env build site -f site.build --context ./site --no-cache`,
		Args: exactArgs(1, "one environment NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.Name = args[0]
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return envBuildRun(cmd.Context(), opts)
		},
	}
	cmd.Flags().StringVarP(&opts.File, "file", "f", "", "build file (required)")
	cmd.Flags().StringVar(&opts.ContextDir, "context", "", "directory COPY reads from (default: the build file's directory)")
	cmd.Flags().BoolVar(&opts.NoCache, "no-cache", false, "rebuild every step")
	cmd.Flags().BoolVarP(&opts.Quiet, "quiet", "q", false, "do not show what RUN steps print")
	_ = cmd.MarkFlagRequired("file")
	return cmd
}

func envBuildRun(ctx context.Context, opts *EnvBuildOptions) error {
	f := opts.F
	if err := layering.ValidateName("NAME", opts.Name); err != nil {
		return err
	}
	fh, err := os.Open(opts.File)
	if err != nil {
		return fmt.Errorf("--file: %w: %w", err, layering.ErrInvalid)
	}
	defer fh.Close()
	bf, err := layering.ParseBuildFile(fh)
	if err != nil {
		return fmt.Errorf("%s: %w", opts.File, err)
	}
	if opts.ContextDir == "" {
		opts.ContextDir = filepath.Dir(opts.File)
	}
	if st, err := os.Stat(opts.ContextDir); err != nil || !st.IsDir() {
		return fmt.Errorf("--context %s is not a directory: %w", opts.ContextDir, layering.ErrInvalid)
	}
	l, err := f.Layering(ctx)
	if err != nil {
		return err
	}
	defer l.Close()
	var out io.Writer = f.ErrOut
	if opts.Quiet {
		out = io.Discard
	}
	res, err := l.Manager.Build(ctx, opts.Name, bf, layering.BuildOptions{ContextDir: opts.ContextDir, Output: out, Progress: f.Progress(), NoCache: opts.NoCache})
	if err != nil {
		return err
	}
	return printOut(f, res, func(w io.Writer) {
		fmt.Fprintln(w, "STEP\tLAYER\tCACHED\tTIME")
		for _, s := range res.Steps {
			layer := s.Image
			if layer == "" {
				layer = "-"
			}
			fmt.Fprintf(w, "%s\t%s\t%v\t%.2fs\n", truncate(s.Step, 60), layer, s.Cached, s.Duration.Seconds())
		}
		fmt.Fprintf(w, "\nBuilt %s as %s\n", res.Env.Name, res.Env.Ref)
	})
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-3] + "..."
}
