package runtime

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"
)

// FakeBusybox returns fake versions of the busybox applets that
// runtimetest.RunSuite runs, with the same arguments and output:
//
//	echo ARGS...               cat                     true, false
//	seq [FIRST] LAST           sleep SECONDS
//	grep PATTERN /proc/self/status   (Name, CapInh, CapPrm, CapEff, CapBnd)
//	nc -ll -p PORT -e PROG [ARGS...] (persistent TCP server; PROG talks to each client)
func FakeBusybox() map[string]FakeProgram {
	return map[string]FakeProgram{
		"echo":  fakeEcho,
		"cat":   fakeCat,
		"env":   fakeEnv,
		"true":  func(context.Context, *FakeProcess) int { return 0 },
		"false": func(context.Context, *FakeProcess) int { return 1 },
		"seq":   fakeSeq,
		"sleep": fakeSleep,
		"grep":  fakeGrep,
		"nc":    fakeNC,
	}
}

func fakeEcho(_ context.Context, p *FakeProcess) int {
	fmt.Fprintln(p.Stdout, strings.Join(p.Args[1:], " "))
	return 0
}

func fakeEnv(_ context.Context, p *FakeProcess) int {
	for _, kv := range p.Env {
		fmt.Fprintln(p.Stdout, kv)
	}
	return 0
}

func fakeCat(ctx context.Context, p *FakeProcess) int {
	if _, err := io.Copy(p.Stdout, p.Stdin); err != nil {
		return 1
	}
	return 0
}

func fakeSeq(_ context.Context, p *FakeProcess) int {
	first, last := 1, 0
	var err error
	switch len(p.Args) {
	case 2:
		last, err = strconv.Atoi(p.Args[1])
	case 3:
		first, err = strconv.Atoi(p.Args[1])
		if err == nil {
			last, err = strconv.Atoi(p.Args[2])
		}
	default:
		err = errors.New("usage: seq [FIRST] LAST")
	}
	if err != nil {
		fmt.Fprintln(p.Stdout, "seq:", err)
		return 1
	}
	for i := first; i <= last; i++ {
		fmt.Fprintln(p.Stdout, i)
	}
	return 0
}

func fakeSleep(ctx context.Context, p *FakeProcess) int {
	if len(p.Args) != 2 {
		fmt.Fprintln(p.Stdout, "sleep: usage: sleep SECONDS")
		return 1
	}
	secs, err := strconv.ParseFloat(p.Args[1], 64)
	if err != nil {
		fmt.Fprintln(p.Stdout, "sleep: invalid number", p.Args[1])
		return 1
	}
	t := time.NewTimer(time.Duration(secs * float64(time.Second)))
	defer t.Stop()
	select {
	case <-t.C:
		return 0
	case <-ctx.Done():
		return 1
	}
}

func fakeGrep(_ context.Context, p *FakeProcess) int {
	if len(p.Args) != 3 || p.Args[2] != "/proc/self/status" {
		fmt.Fprintln(p.Stdout, "grep: the fake only reads /proc/self/status")
		return 2
	}
	status := fmt.Sprintf("Name:\tgrep\nCapInh:\t%016x\nCapPrm:\t%016x\nCapEff:\t%016x\nCapBnd:\t%016x\n", 0, p.CapEff, p.CapEff, p.CapEff)
	found := false
	sc := bufio.NewScanner(strings.NewReader(status))
	for sc.Scan() {
		if strings.Contains(sc.Text(), p.Args[1]) {
			fmt.Fprintln(p.Stdout, sc.Text())
			found = true
		}
	}
	if !found {
		return 1
	}
	return 0
}

func fakeNC(ctx context.Context, p *FakeProcess) int {
	var port int
	var prog []string
	persistent := false
	args := p.Args[1:]
	for i := 0; i < len(args); i++ {
		switch args[i] {
		case "-l":
		case "-ll":
			persistent = true
		case "-p":
			if i+1 < len(args) {
				port, _ = strconv.Atoi(args[i+1])
				i++
			}
		case "-e":
			prog = args[i+1:]
			i = len(args)
		default:
			fmt.Fprintln(p.Stdout, "nc: the fake only serves: nc -l[l] -p PORT -e PROG [ARGS...]")
			return 1
		}
	}
	if port <= 0 || port > 65535 || len(prog) == 0 {
		fmt.Fprintln(p.Stdout, "nc: the fake only serves: nc -l[l] -p PORT -e PROG [ARGS...]")
		return 1
	}
	l, err := p.Listen(uint16(port), "tcp")
	if err != nil {
		fmt.Fprintln(p.Stdout, "nc:", err)
		return 1
	}
	go func() {
		<-ctx.Done()
		_ = l.Close()
	}()
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		conn, err := l.Accept()
		if err != nil {
			return 1 // listener closed: stopped
		}
		wg.Add(1)
		go func(conn net.Conn) {
			defer wg.Done()
			defer conn.Close()
			p.Run(ctx, prog, conn, conn)
		}(conn)
		if !persistent {
			wg.Wait()
			return 0
		}
	}
}
