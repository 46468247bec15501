package runtime

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/fogdeploy/fogdeploy/internal/instancectl"
)

// FakeDMTCPImageFile is the file of a fake checkpoint image in its
// generation directory.
const FakeDMTCPImageFile = "fake-image.json"

// FakeDMTCP returns the programs of a fake DMTCP image for Fake, so that
// what drives the DMTCP container (deploy's Container driver) runs its
// whole lifecycle without dockerd or DMTCP:
//
//   - launch, restart and boot: the entrypoint's modes, with the flags
//     DMTCPContainer passes (Launch, Restart, Boot, plus -gen N), under
//     either engine (-engine dmtcp or criu, -lazy: the fake's checkpoint
//     is the same). The app
//     is a program of the same image; its memory is what FakeDMTCP's apps
//     keep (fakeMemory). On SIGUSR1 launch and restart stop the app and
//     write its argv and memory into generation /fog/ckpt/<gen> (launch:
//     -gen, default 1; restart: the generation restored + 1), print the
//     checkpoint timing line and exit 0; restart -from N (0: the newest)
//     runs the same argv with the memory of generation N, and exits 4 when
//     there is none, as the real entrypoint does. With -ready ADDR they
//     probe the published port of ADDR's port (-ready-send/-ready-expect,
//     or -ready-http/-ready-status) and print <mode>_ready.
//   - check -engine criu: passes (exit 0) when the container holds what
//     criu needs to dump and restore (CRIUCapabilities), fails (exit 3)
//     otherwise, as `criu check` in a container without them does.
//   - redis-server: PING, SET, GET and DEL of a Redis server on --port
//     (6379), RESP or inline, with its keys in the entrypoint's memory. It
//     prints "Ready to accept connections tcp" once it listens.
func FakeDMTCP() map[string]FakeProgram {
	return map[string]FakeProgram{
		"launch":       fakeEntrypoint,
		"restart":      fakeEntrypoint,
		"boot":         fakeEntrypoint,
		"check":        fakeCheck,
		"redis-server": fakeRedis,
	}
}

// fakeMemory is an app's memory: what a checkpoint saves and a restart
// gives back.
type fakeMemory struct {
	mu sync.Mutex
	m  map[string]string
}

type fakeMemoryKey struct{}

// memoryOf returns the memory the entrypoint gave the app, or a fresh one
// when it runs without an entrypoint.
func memoryOf(ctx context.Context) *fakeMemory {
	if m, ok := ctx.Value(fakeMemoryKey{}).(*fakeMemory); ok {
		return m
	}
	return &fakeMemory{m: map[string]string{}}
}

// fakeCheckpoint is the content of FakeDMTCPImageFile.
type fakeCheckpoint struct {
	Argv   []string          `json:"argv"`
	Memory map[string]string `json:"memory"`
}

type fakeFlags struct {
	gen, from           int
	ready, send, expect string
	httpPath            string
	status              int
	delay               time.Duration
	wait                string
	recycle             bool
	sourceLater         bool
	rootLater           bool
	// engine is the checkpoint engine the entrypoint runs (-engine): the
	// fake keeps the same image for either; lazy (-lazy) changes nothing.
	engine string
	lazy   bool
}

// parseFakeFlags parses the entrypoint's flags up to "--".
func parseFakeFlags(args []string) (fakeFlags, []string, error) {
	var f fakeFlags
	for len(args) > 0 {
		name := args[0]
		if name == "--" {
			return f, args[1:], nil
		}
		if name == "-recycle" || name == "-lazy" || name == "-source-later" || name == "-root-later" { // the flags without a value
			f.recycle = f.recycle || name == "-recycle"
			f.lazy = f.lazy || name == "-lazy"
			f.sourceLater = f.sourceLater || name == "-source-later"
			f.rootLater = f.rootLater || name == "-root-later"
			args = args[1:]
			continue
		}
		if !strings.HasPrefix(name, "-") || len(args) < 2 {
			return f, nil, fmt.Errorf("flag %q: want -NAME VALUE or --", name)
		}
		v := args[1]
		args = args[2:]
		var err error
		switch name {
		case "-gen":
			f.gen, err = strconv.Atoi(v)
		case "-from":
			f.from, err = strconv.Atoi(v)
		case "-ready":
			f.ready = v
		case "-ready-send":
			f.send = unescapeFlag(v)
		case "-ready-expect":
			f.expect = unescapeFlag(v)
		case "-ready-http":
			f.httpPath = v
		case "-ready-status":
			f.status, err = strconv.Atoi(v)
		case "-checkpoint-delay":
			f.delay, err = time.ParseDuration(v)
		case "-wait":
			f.wait = v
		case "-engine":
			if v != "dmtcp" && v != "criu" {
				err = fmt.Errorf("want dmtcp or criu")
			}
			f.engine = v
		case "-workdir", "-user", "-after-checkpoint", "-root":
			// Accepted; the fake has no file system, users or continue.
		default:
			err = fmt.Errorf("unknown flag")
		}
		if err != nil {
			return f, nil, fmt.Errorf("flag %s %q: %w", name, v, err)
		}
	}
	return f, nil, nil
}

// unescapeFlag undoes the escapes \r, \n, \t and \\ of the ready flags.
func unescapeFlag(s string) string {
	return strings.NewReplacer(`\\`, `\`, `\r`, "\r", `\n`, "\n", `\t`, "\t").Replace(s)
}

func fakeCheck(_ context.Context, p *FakeProcess) int {
	if !slices.Contains(p.Args, "criu") {
		fmt.Fprintln(p.Stdout, "dmtcp: the coordinator needs no check")
		return 0
	}
	need, _ := CapMask(CRIUCapabilities())
	if p.CapEff&need != need {
		fmt.Fprintf(p.Stdout, "criu: check failed: the container lacks capabilities %#x\n", need&^p.CapEff)
		return 3
	}
	fmt.Fprintln(p.Stdout, "criu 4.2: check passed")
	return 0
}

func fakeEntrypoint(ctx context.Context, p *FakeProcess) int {
	mode := path.Base(p.Args[0])
	start := time.Now()
	timing := func(t Timing) {
		t.Mode = mode
		b, _ := json.Marshal(t)
		fmt.Fprintln(p.Stdout, string(b))
	}
	fl, argv, err := parseFakeFlags(p.Args[1:])
	if err != nil {
		fmt.Fprintln(p.Stdout, "entrypoint:", err)
		return 2
	}
	mem := &fakeMemory{m: map[string]string{}}
	gen := fl.gen
	if gen == 0 {
		gen = 1
	}
	ckpt, hasCkpt := p.HostPath(DMTCPCkptPath)
	var restored map[string]string // the restored image's memory
	// load reads the image a restart restores: at the start, or, with
	// -source-later, once the order is given.
	load := func() int {
		from, img, err := readFakeCheckpoint(p, ckpt, fl.from)
		if !hasCkpt || err != nil {
			timing(Timing{Phase: "restart", Error: "no complete checkpoint"})
			fmt.Fprintf(p.Stdout, "entrypoint: no complete checkpoint in %s: %v\n", DMTCPCkptPath, err)
			return 4
		}
		mem.mu.Lock()
		argv, mem.m, gen = img.Argv, maps.Clone(img.Memory), from+1
		if mem.m == nil {
			mem.m = map[string]string{}
		}
		mem.mu.Unlock()
		restored = img.Memory
		return 0
	}
	switch mode {
	case "launch", "boot":
		if len(argv) == 0 {
			fmt.Fprintln(p.Stdout, "entrypoint: no command after --")
			return 2
		}
		load = nil
	case "restart":
		if (fl.sourceLater || fl.rootLater) && fl.wait != "" {
			gen = fl.from + 1
			break
		}
		if code := load(); code != 0 {
			return code
		}
		load = nil
	default:
		fmt.Fprintln(p.Stdout, "entrypoint: unknown mode", mode)
		return 2
	}
	for {
		code, again := fakeLife(ctx, p, fl, mode, &argv, mem, ckpt, hasCkpt, &gen, start, timing, load)
		if !again {
			return code
		}
		load = nil
		// Recycled (-recycle): the next instance starts from the image.
		mem.mu.Lock()
		mem.m = maps.Clone(restored)
		if mem.m == nil {
			mem.m = map[string]string{}
		}
		mem.mu.Unlock()
		start = time.Now()
	}
}

// fakeBindIdentity says, as the real entrypoint does once it has bound the
// control directory's identity directory where the app reads its identity,
// that the agent may write the identity there.
func fakeBindIdentity(ctl string) {
	marker := filepath.Join(ctl, instancectl.IdentityBound)
	_ = os.Remove(marker)
	if st, err := os.Lstat(filepath.Join(ctl, instancectl.IdentityDir)); err == nil && st.IsDir() {
		_ = os.WriteFile(marker, nil, 0o644)
	}
}

// fakeLife is one instance of the fake entrypoint: the order awaited, the
// image read then if load is set (-source-later), the app run until it
// exits, is checkpointed, or (-recycle) is released; it reports again once
// released and rearmed.
func fakeLife(ctx context.Context, p *FakeProcess, fl fakeFlags, mode string, argvp *[]string, mem *fakeMemory, ckpt string,
	hasCkpt bool, genp *int, start time.Time, timing func(Timing), load func() int) (int, bool) {
	var ctl string
	if fl.wait != "" {
		// As the real entrypoint: everything is ready, the app starts when
		// the order file appears in the bound control directory.
		var ok bool
		ctl, ok = p.HostPath(path.Dir(fl.wait))
		if !ok {
			fmt.Fprintf(p.Stdout, "entrypoint: -wait %s: its directory is not bound\n", fl.wait)
			return 3, false
		}
		if !fl.rootLater { // the root is prepared before the order
			fakeBindIdentity(ctl)
		}
		t0 := time.Now()
		if !waitForFile(ctx, filepath.Join(ctl, path.Base(fl.wait))) {
			return 0, false
		}
		if fl.rootLater {
			fakeBindIdentity(ctl)
		}
		timing(Timing{Phase: "order", MS: float64(time.Since(t0).Microseconds()) / 1000})
		start = time.Now()
	}
	if load != nil {
		if code := load(); code != 0 {
			return code, false
		}
	}
	argv, gen := *argvp, *genp
	appCtx, stopApp := context.WithCancel(context.WithValue(ctx, fakeMemoryKey{}, mem))
	defer stopApp()
	exited := make(chan int, 1)
	go func() { exited <- p.Run(appCtx, argv, strings.NewReader(""), p.Stdout) }()
	if fl.ready != "" {
		go func() {
			if fakeProbe(appCtx, p, fl) {
				timing(Timing{Phase: mode + "_ready", MS: float64(time.Since(start).Microseconds()) / 1000})
			}
		}()
	}
	signals := p.Signals()
	release := time.NewTicker(10 * time.Millisecond)
	defer release.Stop()
	for {
		select {
		case <-release.C:
			if !fl.recycle || ctl == "" {
				continue
			}
			if _, err := os.Stat(filepath.Join(ctl, instancectl.Release)); err != nil {
				continue
			}
			stopApp()
			<-exited
			return fakeRelease(ctx, ctl, fl.wait)
		case code := <-exited:
			return code, false
		case <-ctx.Done():
			stopApp()
			return <-exited, false
		case sig := <-signals:
			if sig != "USR1" || mode == "boot" {
				continue
			}
			if fl.delay > 0 {
				time.Sleep(fl.delay)
			}
			t0 := time.Now()
			stopApp()
			<-exited
			return fakeCheckpointTo(ckpt, gen, hasCkpt, argv, mem, t0, timing), false
		}
	}
}

// fakeRelease is a recycled instance's release: the app is gone; the
// entrypoint says so (Released), waits for the agent's Rearm and clears
// the control directory for the next order.
func fakeRelease(ctx context.Context, ctl, wait string) (int, bool) {
	_ = os.Remove(filepath.Join(ctl, path.Base(wait)))
	if err := os.WriteFile(filepath.Join(ctl, instancectl.Released), []byte("{}"), 0o644); err != nil {
		return 3, false
	}
	if !waitForFile(ctx, filepath.Join(ctl, instancectl.Rearm)) {
		return 0, false
	}
	for _, f := range []string{instancectl.Release, instancectl.Released, instancectl.Rearm} {
		_ = os.Remove(filepath.Join(ctl, f))
	}
	return 0, true
}

// fakeCheckpointTo writes the stopped app's argv and memory as generation
// gen under ckpt, and returns the entrypoint's exit code.
func fakeCheckpointTo(ckpt string, gen int, hasCkpt bool, argv []string, mem *fakeMemory, t0 time.Time, timing func(Timing)) int {
	mem.mu.Lock()
	b, err := json.Marshal(fakeCheckpoint{Argv: argv, Memory: mem.m})
	mem.mu.Unlock()
	dir := filepath.Join(ckpt, strconv.Itoa(gen))
	if err == nil {
		err = os.MkdirAll(dir, 0o755)
	}
	if err == nil {
		err = os.WriteFile(filepath.Join(dir, FakeDMTCPImageFile), b, 0o644)
	}
	if err != nil || !hasCkpt {
		timing(Timing{Phase: "checkpoint", Gen: gen, Error: fmt.Sprintf("write generation %d: %v", gen, err)})
		return 3
	}
	timing(Timing{Phase: "checkpoint", Gen: gen, MS: float64(time.Since(t0).Microseconds()) / 1000, Bytes: int64(len(b))})
	return 0
}

// waitForFile polls until file exists, and reports false if ctx ends
// first.
func waitForFile(ctx context.Context, file string) bool {
	for {
		if _, err := os.Stat(file); err == nil {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(2 * time.Millisecond):
		}
	}
}

// readFakeCheckpoint reads generation from of the checkpoint at host
// directory ckpt (0: the newest), where p's binds put it: a generation
// may be bound on its own inside the checkpoint directory.
func readFakeCheckpoint(p *FakeProcess, ckpt string, from int) (int, fakeCheckpoint, error) {
	file := func(gen string) string {
		if h, ok := p.HostPath(path.Join(DMTCPCkptPath, gen, FakeDMTCPImageFile)); ok {
			return h
		}
		return filepath.Join(ckpt, gen, FakeDMTCPImageFile)
	}
	if from == 0 {
		ents, _ := os.ReadDir(ckpt)
		for _, e := range ents {
			if n, err := strconv.Atoi(e.Name()); err == nil && n > from {
				if _, err := os.Stat(file(e.Name())); err == nil {
					from = n
				}
			}
		}
	}
	var img fakeCheckpoint
	b, err := os.ReadFile(file(strconv.Itoa(from)))
	if err == nil {
		err = json.Unmarshal(b, &img)
	}
	return from, img, err
}

// fakeProbe probes the published port of fl.ready until the app answers as
// the flags ask, or ctx is done.
func fakeProbe(ctx context.Context, p *FakeProcess, fl fakeFlags) bool {
	_, port, _ := net.SplitHostPort(fl.ready)
	n, _ := strconv.Atoi(port)
	addr := p.PublishedAddr(uint16(n), "tcp")
	if addr == "" {
		return false
	}
	for {
		if fakeProbeOnce(ctx, addr, fl) == nil {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(10 * time.Millisecond):
		}
	}
}

func fakeProbeOnce(ctx context.Context, addr string, fl fakeFlags) error {
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if fl.httpPath != "" {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+fl.httpPath, nil)
		if err != nil {
			return err
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if (fl.status != 0 && resp.StatusCode != fl.status) || (fl.status == 0 && resp.StatusCode/100 != 2) {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	if fl.send == "" {
		return nil
	}
	deadline, _ := ctx.Deadline()
	_ = c.SetDeadline(deadline)
	if _, err := io.WriteString(c, fl.send); err != nil {
		return err
	}
	buf := make([]byte, len(fl.expect))
	if _, err := io.ReadFull(c, buf); err != nil {
		return err
	}
	if string(buf) != fl.expect {
		return fmt.Errorf("reply %q", buf)
	}
	return nil
}
