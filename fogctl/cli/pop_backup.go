package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/fogdeploy/fogdeploy/internal/atomicfile"
	"github.com/fogdeploy/fogdeploy/internal/hint"
	"github.com/fogdeploy/fogdeploy/internal/state"
)

// NewCmdPop builds `fogctl pop`, the commands on the PoP as a whole.
func NewCmdPop(f *Factory) *cobra.Command {
	cmd := &cobra.Command{Use: "pop", Short: "Back up the PoP's state"}
	cmd.AddCommand(NewCmdPopBackup(f, nil))
	return cmd
}

// PopBackupOptions are the inputs of `fogctl pop backup`.
type PopBackupOptions struct {
	F    *Factory
	File string
	// Force replaces an existing file.
	Force bool
}

// NewCmdPopBackup builds `fogctl pop backup FILE`.
func NewCmdPopBackup(f *Factory, runF func(context.Context, *PopBackupOptions) error) *cobra.Command {
	opts := &PopBackupOptions{F: f}
	cmd := &cobra.Command{
		Use:   "backup FILE",
		Short: "Write a snapshot of the PoP's etcd to FILE, and record it for gc",
		Long: "Records the backup in etcd (/fogdeploy/backup), then writes a snapshot of etcd's whole keyspace to FILE " +
			"(mode 0600; etcd's own format: restore it with `etcdutl snapshot restore`). From then on `fogctl gc` removes no " +
			"image made after the last backup: an etcd restored from it would not know such an image, and would call it an orphan. " +
			"Take backups regularly: what gc keeps for that reason waits for the next one.",
		Args: exactArgs(1, "the file to write"),
		RunE: func(cmd *cobra.Command, args []string) error {
			opts.File = args[0]
			if runF != nil {
				return runF(cmd.Context(), opts)
			}
			return popBackupRun(cmd.Context(), opts)
		},
	}
	cmd.Flags().BoolVar(&opts.Force, "force", false, "replace FILE if it exists")
	return cmd
}

// backupResult is what `fogctl pop backup` answers.
type backupResult struct {
	File string `json:"file"`
	state.Backup
}

func popBackupRun(ctx context.Context, opts *PopBackupOptions) error {
	if _, err := os.Stat(opts.File); err == nil && !opts.Force {
		return hint.With(fmt.Errorf("FILE %s exists", opts.File), "give another file, or --force to replace it")
	}
	dir := filepath.Dir(opts.File)
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return hint.With(fmt.Errorf("FILE %s: its directory %s is not one", opts.File, dir), "create the directory first")
	}
	st, err := opts.F.State(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	progressTo(opts.F)("snapshot of etcd to " + opts.File)
	tmp, err := os.CreateTemp(dir, ".fogdeploy-backup-*")
	if err != nil {
		return err
	}
	done := false
	defer func() {
		if !done {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := tmp.Chmod(0o600); err != nil {
		return err
	}
	start := time.Now()
	b, err := st.Snapshot(ctx, tmp)
	if err != nil {
		return err
	}
	if err := errors.Join(tmp.Sync(), tmp.Close()); err != nil {
		return fmt.Errorf("FILE %s: %w", opts.File, err)
	}
	if err := os.Rename(tmp.Name(), opts.File); err != nil {
		return err
	}
	done = true
	if err := atomicfile.SyncDir(dir); err != nil {
		return err
	}
	return printOut(opts.F, backupResult{File: opts.File, Backup: b}, func(w io.Writer) {
		fmt.Fprintf(w, "%s: etcd at revision %d, %d bytes, in %s; gc now removes nothing made after %s\n",
			opts.File, b.Revision, b.Bytes, time.Since(start).Round(time.Millisecond), b.Taken.Format(time.RFC3339))
	})
}
