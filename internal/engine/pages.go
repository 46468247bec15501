package engine

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"syscall"

	"google.golang.org/protobuf/encoding/protowire"
)

// PagesSocket, in a checkpoint image's directory, is the page server of a
// lazy restore whose pages are elsewhere (a migration's source): the
// directory's page files hold only what a lazy restore reads at once (its
// Pages.Holes were never written), and Restore with RestoreSpec.Lazy asks
// this socket for the rest. An image with it is never restored at once.
const PagesSocket = "pages.sock"

// Extent is a byte range of a file.
type Extent struct{ Off, Len int64 }

// Pages is the memory of a CRIU image as a page server serves it to a lazy
// restore on another node (`criu lazy-pages --page-server`): where each
// page of each task is in the image's page files, and which of them a
// lazy restore reads from the page server instead of the files (CRIU marks
// them lazy in the pagemap: private anonymous memory; stacks, shared and
// file-backed memory are restored at once). It reads what a checkpoint
// wrote and trusts none of it: the pagemaps are bounded and checked, and
// a request for a page the image does not hold lazily ends the session.
type Pages struct {
	dir   string
	tasks map[uint64][]pageRun
	files map[uint32]*os.File
	holes map[string][]Extent
	bytes int64 // of the lazy pages
}

// pageRun is one pagemap entry with its pages in file pages-<file>.img at
// off.
type pageRun struct {
	vaddr, end uint64
	file       uint32
	off        int64
	lazy       bool
}

// PageStats are what one Serve handed out.
type PageStats struct {
	Requests int
	Bytes    int64
	// Closed: the restore said it had every page (PS_IOV_CLOSE), not the
	// connection's end.
	Closed bool
}

// ErrPagesCut: a page session ended before the restore said it had every
// page.
var ErrPagesCut = errors.New("page session cut before every page was in")

// CRIU's image and page-server constants (criu/include/magic.h,
// pagemap.h, page-xfer.c).
const (
	imgCommonMagic = 0x54564319
	pagemapMagic   = 0x56084025
	peParent       = 1 << 0
	peLazy         = 1 << 1
	pePresent      = 1 << 2
	psIOVAddF      = 6
	psIOVGet       = 7
	psIOVClose     = 0x1023
	psIOVForce     = 0x1024
	psCmdBits      = 16
	psiSize        = 32 // struct page_server_iov {u32 cmd; u64 nr_pages, vaddr, dst_id}
	pageSize       = 4096
	// maxPagemap bounds a pagemap file: a few entries per mapping.
	maxPagemap = 64 << 20
)

var pagemapName = regexp.MustCompile(`^pagemap-([0-9]+)\.img$`)

// OpenPagesIn is OpenPages of the image in checkpoint directory dir.
func OpenPagesIn(dir string) (*Pages, error) {
	img, err := ReadImage(dir)
	if err != nil {
		return nil, err
	}
	return OpenPages(img)
}

// OpenPages reads the memory layout of image img, whose engine must serve
// its pages to a remote lazy restore (Facts.RemotePages), else ErrInvalid.
func OpenPages(img Image) (_ *Pages, err error) {
	if !Of(img.Engine).RemotePages {
		return nil, fmt.Errorf("%s images cannot be restored from a remote page server: %w", img.Engine, ErrInvalid)
	}
	if img.Compression != "" {
		return nil, fmt.Errorf("a compressed image cannot be served page by page: %w", ErrInvalid)
	}
	p := &Pages{dir: img.Dir, tasks: map[uint64][]pageRun{}, files: map[uint32]*os.File{}, holes: map[string][]Extent{}}
	defer func() {
		if err != nil {
			p.Close()
		}
	}()
	ents, err := os.ReadDir(img.Dir)
	if err != nil {
		return nil, err
	}
	for _, e := range ents {
		m := pagemapName.FindStringSubmatch(e.Name())
		if m == nil || !e.Type().IsRegular() {
			continue
		}
		pid, err := strconv.ParseUint(m[1], 10, 32)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", e.Name(), ErrNoImage)
		}
		if err := p.readPagemap(pid, filepath.Join(img.Dir, e.Name())); err != nil {
			return nil, err
		}
	}
	if len(p.tasks) == 0 {
		return nil, fmt.Errorf("image %s has no pagemap: %w", img.Dir, ErrNoImage)
	}
	return p, nil
}

// readPagemap reads task pid's pagemap and opens its page file.
func (p *Pages) readPagemap(pid uint64, path string) error {
	bad := func(why string) error { return fmt.Errorf("%s: %s: %w", path, why, ErrNoImage) }
	b, err := readBounded(path, maxPagemap)
	if err != nil {
		return err
	}
	if len(b) < 8 || binary.LittleEndian.Uint32(b) != imgCommonMagic || binary.LittleEndian.Uint32(b[4:]) != pagemapMagic {
		return bad("not a pagemap")
	}
	b = b[8:]
	next := func() ([]byte, bool) {
		if len(b) < 4 {
			return nil, false
		}
		n := binary.LittleEndian.Uint32(b)
		if uint64(n) > uint64(len(b)-4) {
			return nil, false
		}
		e := b[4 : 4+n]
		b = b[4+n:]
		return e, true
	}
	head, ok := next()
	if !ok {
		return bad("no head")
	}
	fid, ok := varintField(head, 1)
	if !ok || fid > 1<<31 {
		return bad("no pages_id")
	}
	file := uint32(fid)
	name := fmt.Sprintf("pages-%d.img", file)
	f, err := os.Open(filepath.Join(p.dir, name))
	if err != nil {
		return err
	}
	p.files[file] = f
	st, err := f.Stat()
	if err != nil {
		return err
	}
	var off int64
	var runs []pageRun
	var last uint64
	for len(b) > 0 {
		e, ok := next()
		if !ok {
			return bad("a truncated entry")
		}
		var vaddr, compat, nr, flags uint64
		var hasNr, hasFlags, inParent bool
		for len(e) > 0 {
			num, typ, n := protowire.ConsumeTag(e)
			if n < 0 || typ != protowire.VarintType {
				return bad("an entry of unknown form")
			}
			e = e[n:]
			v, m := protowire.ConsumeVarint(e)
			if m < 0 {
				return bad("an entry of unknown form")
			}
			e = e[m:]
			switch num {
			case 1:
				vaddr = v
			case 2:
				compat = v
			case 3:
				inParent = v != 0
			case 4:
				flags, hasFlags = v, true
			case 5:
				nr, hasNr = v, true
			}
		}
		if !hasNr {
			nr = compat
		}
		switch {
		case inParent:
			flags |= peParent
		case !hasFlags:
			flags = pePresent
		}
		if vaddr%pageSize != 0 || nr == 0 || nr > 1<<36 || vaddr < last || vaddr+nr*pageSize < vaddr {
			return bad(fmt.Sprintf("entry %#x+%d pages out of order or size", vaddr, nr))
		}
		last = vaddr + nr*pageSize
		if flags&pePresent == 0 || flags&peParent != 0 {
			continue
		}
		r := pageRun{vaddr: vaddr, end: last, file: file, off: off, lazy: flags&peLazy != 0}
		off += int64(nr * pageSize)
		if off > st.Size() {
			return bad(fmt.Sprintf("its pages run past the end of %s", name))
		}
		runs = append(runs, r)
		if r.lazy {
			p.addHole(name, Extent{Off: r.off, Len: int64(r.end - r.vaddr)})
			p.bytes += int64(r.end - r.vaddr)
		}
	}
	p.tasks[pid] = runs
	return nil
}

// addHole adds x to file's holes, merged with the last one it touches.
func (p *Pages) addHole(file string, x Extent) {
	hs := p.holes[file]
	if n := len(hs); n > 0 && hs[n-1].Off+hs[n-1].Len == x.Off {
		hs[n-1].Len += x.Len
		return
	}
	p.holes[file] = append(hs, x)
}

// Holes are, by file name, the byte ranges of the image's files that a
// lazy restore reads from the page server, in order: a copy of the image
// for a remote lazy restore need not hold them.
func (p *Pages) Holes() map[string][]Extent {
	out := make(map[string][]Extent, len(p.holes))
	for f, hs := range p.holes {
		out[f] = slices.Clone(hs)
	}
	return out
}

// LazyBytes is the size of the pages a lazy restore reads from the page
// server.
func (p *Pages) LazyBytes() int64 { return p.bytes }

// Close closes the image's page files.
func (p *Pages) Close() error {
	var errs []error
	for _, f := range p.files {
		errs = append(errs, f.Close())
	}
	p.files = nil
	return errors.Join(errs...)
}

// Serve answers the page requests of one lazy restore (`criu lazy-pages
// --page-server`) on conn, in CRIU's page-server protocol: each request
// names a task, an address and a count of pages, and gets the pages the
// image holds lazily from that address on, to the end of their run. It
// returns once the restore says it has every page (Closed), or with
// ErrPagesCut when conn ends first, or an error for a request the image
// cannot answer (which ends the session, as CRIU's own server does). ctx
// ending closes nothing: the caller closes conn.
func (p *Pages) Serve(ctx context.Context, conn io.ReadWriter) (PageStats, error) {
	var st PageStats
	req := make([]byte, psiSize)
	for {
		if _, err := io.ReadFull(conn, req); err != nil {
			if ctx.Err() != nil {
				return st, ctx.Err()
			}
			return st, fmt.Errorf("%w: %w", ErrPagesCut, err)
		}
		cmd := binary.LittleEndian.Uint32(req) & (1<<psCmdBits - 1)
		nr, vaddr, pid := binary.LittleEndian.Uint64(req[8:]), binary.LittleEndian.Uint64(req[16:]), binary.LittleEndian.Uint64(req[24:])
		switch cmd {
		case psIOVClose, psIOVForce:
			// Its answer: a status of 0, all received.
			if _, err := conn.Write(make([]byte, 4)); err != nil {
				return st, fmt.Errorf("%w: %w", ErrPagesCut, err)
			}
			st.Closed = true
			return st, nil
		case psIOVGet:
		default:
			return st, fmt.Errorf("page server: unknown request %#x: %w", cmd, ErrInvalid)
		}
		st.Requests++
		r, ok := p.find(pid, vaddr)
		if !ok || !r.lazy || nr == 0 {
			return st, fmt.Errorf("page server: task %d asked for %d pages at %#x, which the image does not hold lazily: %w", pid, nr, vaddr, ErrInvalid)
		}
		n := min(nr, (r.end-vaddr)/pageSize)
		resp := make([]byte, psiSize)
		binary.LittleEndian.PutUint32(resp, pePresent<<psCmdBits|psIOVAddF)
		binary.LittleEndian.PutUint64(resp[8:], n)
		binary.LittleEndian.PutUint64(resp[16:], vaddr)
		binary.LittleEndian.PutUint64(resp[24:], pid)
		if _, err := conn.Write(resp); err != nil {
			return st, fmt.Errorf("%w: %w", ErrPagesCut, err)
		}
		sec := io.NewSectionReader(p.files[r.file], r.off+int64(vaddr-r.vaddr), int64(n*pageSize))
		w, err := io.Copy(conn, sec)
		st.Bytes += w
		if err != nil {
			return st, fmt.Errorf("%w: %w", ErrPagesCut, err)
		}
		if w != int64(n*pageSize) {
			return st, fmt.Errorf("page server: %s ends before the pages at %#x: %w", p.dir, vaddr, ErrNoImage)
		}
	}
}

// find is the run of task pid's pages that holds vaddr.
func (p *Pages) find(pid, vaddr uint64) (pageRun, bool) {
	runs := p.tasks[pid]
	i, _ := slices.BinarySearchFunc(runs, vaddr, func(r pageRun, v uint64) int {
		switch {
		case r.end <= v:
			return -1
		case r.vaddr > v:
			return 1
		}
		return 0
	})
	if i < len(runs) && runs[i].vaddr <= vaddr && vaddr < runs[i].end {
		return runs[i], true
	}
	return pageRun{}, false
}

// readBounded reads regular file path, refusing one larger than limit.
func readBounded(path string, limit int64) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if !st.Mode().IsRegular() || st.Size() > limit {
		return nil, fmt.Errorf("%s: not a regular file of at most %d bytes: %w", path, limit, ErrNoImage)
	}
	return io.ReadAll(io.LimitReader(f, limit))
}

// varintField is the first varint field num of protobuf message b.
func varintField(b []byte, num protowire.Number) (uint64, bool) {
	for len(b) > 0 {
		n, typ, l := protowire.ConsumeTag(b)
		if l < 0 {
			return 0, false
		}
		b = b[l:]
		l = protowire.ConsumeFieldValue(n, typ, b)
		if l < 0 {
			return 0, false
		}
		if n == num && typ == protowire.VarintType {
			v, _ := protowire.ConsumeVarint(b)
			return v, true
		}
		b = b[l:]
	}
	return 0, false
}

// ListenPages listens on PagesSocket in directory dir, where a lazy
// restore of the image in dir finds the page server of its memory. The
// socket stays when the listener closes: the image's pages are not in its
// files.
func ListenPages(dir string) (*net.UnixListener, error) {
	d, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	defer d.Close()
	// Through the directory's descriptor: a socket's path is bounded (108
	// bytes), the directory's path is not.
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: fmt.Sprintf("/proc/self/fd/%d/%s", d.Fd(), PagesSocket), Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("page server of %s: %w", dir, err)
	}
	ln.SetUnlinkOnClose(false)
	return ln, nil
}

// RelayPageRequests copies a lazy restore's page requests from src to dst
// (a relay between `criu lazy-pages` and a remote Pages.Serve) until src
// ends, and reports whether the restore asked to close the session, which
// it does once it has every page.
func RelayPageRequests(dst io.Writer, src io.Reader) (closed bool, err error) {
	req := make([]byte, psiSize)
	for {
		if _, err := io.ReadFull(src, req); err != nil {
			if errors.Is(err, io.EOF) {
				err = nil
			}
			return closed, err
		}
		switch binary.LittleEndian.Uint32(req) & (1<<psCmdBits - 1) {
		case psIOVClose, psIOVForce:
			closed = true
		}
		if _, err := dst.Write(req); err != nil {
			return closed, err
		}
	}
}
