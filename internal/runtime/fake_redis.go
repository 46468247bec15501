// The fake redis that the fake DMTCP image runs: a key-value store in memory, whose memory a fake checkpoint keeps.

package runtime

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
)

func fakeRedis(ctx context.Context, p *FakeProcess) int {
	port := 6379
	for i, a := range p.Args {
		if a == "--port" && i+1 < len(p.Args) {
			port, _ = strconv.Atoi(p.Args[i+1])
		}
	}
	l, err := p.Listen(uint16(port), "tcp")
	if err != nil {
		fmt.Fprintln(p.Stdout, "# Could not create server TCP listening socket:", err)
		return 1
	}
	mem := memoryOf(ctx)
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	fmt.Fprintln(p.Stdout, "* Ready to accept connections tcp")
	var mu sync.Mutex
	conns := map[net.Conn]bool{}
	stopped := make(chan struct{})
	go func() {
		<-ctx.Done()
		_ = l.Close()
		mu.Lock()
		for c := range conns {
			_ = c.Close()
		}
		mu.Unlock()
		close(stopped)
	}()
	var wg sync.WaitGroup
	for {
		c, err := l.Accept()
		if err != nil {
			break
		}
		mu.Lock()
		if ctx.Err() != nil {
			mu.Unlock()
			_ = c.Close()
			break
		}
		conns[c] = true
		mu.Unlock()
		wg.Go(func() {
			defer func() {
				mu.Lock()
				delete(conns, c)
				mu.Unlock()
				_ = c.Close()
			}()
			serveFakeRedis(c, mem)
		})
	}
	cancel()
	<-stopped
	wg.Wait()
	return 0
}

func serveFakeRedis(c net.Conn, mem *fakeMemory) {
	r := bufio.NewReader(c)
	for {
		args, err := readRedisCommand(r)
		if err != nil {
			return
		}
		if len(args) == 0 {
			continue
		}
		var reply string
		mem.mu.Lock()
		switch strings.ToUpper(args[0]) {
		case "PING":
			reply = "+PONG\r\n"
		case "SET":
			if len(args) != 3 {
				reply = "-ERR wrong number of arguments for 'set' command\r\n"
				break
			}
			mem.m[args[1]] = args[2]
			reply = "+OK\r\n"
		case "GET":
			if len(args) != 2 {
				reply = "-ERR wrong number of arguments for 'get' command\r\n"
			} else if v, ok := mem.m[args[1]]; ok {
				reply = fmt.Sprintf("$%d\r\n%s\r\n", len(v), v)
			} else {
				reply = "$-1\r\n"
			}
		case "DEL":
			n := 0
			for _, k := range args[1:] {
				if _, ok := mem.m[k]; ok {
					delete(mem.m, k)
					n++
				}
			}
			reply = ":" + strconv.Itoa(n) + "\r\n"
		case "EXISTS":
			n := 0
			for _, k := range args[1:] {
				if _, ok := mem.m[k]; ok {
					n++
				}
			}
			reply = ":" + strconv.Itoa(n) + "\r\n"
		default:
			reply = fmt.Sprintf("-ERR unknown command '%s'\r\n", args[0])
		}
		mem.mu.Unlock()
		if _, err := io.WriteString(c, reply); err != nil {
			return
		}
	}
}

// readRedisCommand reads one command: a RESP array of bulk strings, or an
// inline command line.
func readRedisCommand(r *bufio.Reader) ([]string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return nil, err
	}
	line = strings.TrimRight(line, "\r\n")
	if !strings.HasPrefix(line, "*") {
		return strings.Fields(line), nil
	}
	n, err := strconv.Atoi(line[1:])
	if err != nil || n < 0 || n > 1024 {
		return nil, fmt.Errorf("bad array header %q", line)
	}
	args := make([]string, 0, n)
	for range n {
		h, err := r.ReadString('\n')
		if err != nil {
			return nil, err
		}
		h = strings.TrimRight(h, "\r\n")
		size, err := strconv.Atoi(strings.TrimPrefix(h, "$"))
		if !strings.HasPrefix(h, "$") || err != nil || size < 0 || size > 1<<20 {
			return nil, fmt.Errorf("bad bulk header %q", h)
		}
		buf := make([]byte, size+2)
		if _, err := io.ReadFull(r, buf); err != nil {
			return nil, err
		}
		args = append(args, string(buf[:size]))
	}
	return args, nil
}
