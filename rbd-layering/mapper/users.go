package mapper

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/fogdeploy/fogdeploy/internal/procstat"
)

// Users returns what keeps img (any snapshot of it too) open on this node,
// one description each: the mapping records that name it (of any backend,
// also those of other processes and Mapper instances on the same
// StateDir), rbd-fuse processes that expose it (also one a crash left
// unrecorded, or a pool-wide one), rbd-nbd processes, and krbd devices.
//
// None means that no live client of this node has the image open: a
// watcher that the cluster still lists for it is then a dead client (a
// killed rbd-fuse or agent), which layering.Store.RemoveUnmapped may
// evict. An error means that it could not tell.
func (m *Mapper) Users(img Image) ([]string, error) {
	if err := img.Validate(); err != nil {
		return nil, err
	}
	var users []string
	ids, err := m.store.ids()
	if err != nil {
		return nil, err
	}
	for _, id := range ids {
		rec, err := m.store.load(id)
		if errors.Is(err, ErrNotMapped) {
			continue // released meanwhile
		} else if err != nil {
			return nil, err
		}
		if rec.Image.Pool == img.Pool && rec.Image.Name == img.Name {
			users = append(users, fmt.Sprintf("mapping %s (%s)", rec.ID, rec.Backend))
		}
	}
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, fmt.Errorf("list processes: %w", err)
	}
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if _, alive := procstat.Start(pid); !alive {
			continue // gone, or a zombie: it holds no watch
		}
		if argv := procCmdline(pid); exposes(argv, img) {
			users = append(users, fmt.Sprintf("%s pid %d", filepath.Base(argv[0]), pid))
		}
	}
	devs, _ := filepath.Glob("/sys/bus/rbd/devices/*")
	for _, d := range devs {
		pool, _ := os.ReadFile(filepath.Join(d, "pool"))
		name, _ := os.ReadFile(filepath.Join(d, "name"))
		if strings.TrimSpace(string(pool)) == img.Pool && strings.TrimSpace(string(name)) == img.Name {
			users = append(users, "/dev/rbd"+filepath.Base(d))
		}
	}
	return users, nil
}

// exposes reports whether a process with argv serves img: rbd-fuse with
// its pool and either that image (-r) or every image of the pool, or
// rbd-nbd with POOL/NAME[@SNAP].
func exposes(argv []string, img Image) bool {
	if len(argv) == 0 {
		return false
	}
	switch filepath.Base(argv[0]) {
	case "rbd-fuse":
		pool, image := "rbd", ""
		for i := 1; i < len(argv); i++ {
			flag, val, inline := strings.Cut(argv[i], "=")
			if !inline {
				if i+1 >= len(argv) {
					break
				}
				val = argv[i+1]
			}
			switch flag {
			case "-p", "--poolname":
				pool = val
			case "-r", "--image":
				image = val
			default:
				continue
			}
			if !inline {
				i++
			}
		}
		return pool == img.Pool && (image == "" || image == img.Name)
	case "rbd-nbd":
		spec := img.Pool + "/" + img.Name
		for _, a := range argv[1:] {
			if a == spec || strings.HasPrefix(a, spec+"@") {
				return true
			}
		}
	}
	return false
}
