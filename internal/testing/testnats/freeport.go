package testnats

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// fixedPortFloor is the lowest port FreePort hands out from below the
// kernel's ephemeral range (ports under it are often taken by well-known
// services of the machine).
const fixedPortFloor = 10000

// FreePort returns a loopback TCP port free right now, for a process that
// binds it later (and binds it again when restarted). Where it can, the
// port is below the kernel's ephemeral range (Linux:
// net.ipv4.ip_local_port_range), which the kernel never hands to a
// bind(:0) or an outgoing connection: such a port is only taken by
// another process that chose it on purpose, whereas a port of the
// ephemeral range freed here can be handed to any of the many listeners
// and clients of the tests running alongside before the process binds it
// (a CI run failed on "address already in use" that way). Elsewhere it is
// a port the kernel chose.
func FreePort() (int, error) {
	if low, ok := ephemeralLow(); ok && low > fixedPortFloor+1000 {
		for range 64 {
			port := fixedPortFloor + rand.IntN(low-fixedPortFloor)
			if l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port)); err == nil {
				_ = l.Close()
				return port, nil
			}
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// ephemeralLow is the lowest port of the kernel's ephemeral range, where
// the system says.
func ephemeralLow() (int, bool) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, false
	}
	return parsePortRangeLow(string(b))
}

// parsePortRangeLow reads the low bound of "low high".
func parsePortRangeLow(s string) (int, bool) {
	fields := strings.Fields(s)
	if len(fields) != 2 {
		return 0, false
	}
	low, err := strconv.Atoi(fields[0])
	if err != nil || low <= 0 || low > 65535 {
		return 0, false
	}
	return low, true
}
