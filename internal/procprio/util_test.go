package procprio_test

import (
	"strconv"
	"strings"
	"time"
)

func itoa(i int) string { return strconv.Itoa(i) }

func atoi(s string) int {
	n, _ := strconv.Atoi(strings.Fields(s)[0])
	return n
}

func sleep() { time.Sleep(20 * time.Millisecond) }
