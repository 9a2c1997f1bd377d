// Command netdelay joins network namespaces with links that hold every
// packet for a fixed time, for tests of long links on kernels without
// netem (tc's netem, fq and etf are all missing from the kernels these
// tests run on). Each namespace PREFIXi gets a TUN device tun0 at
// SUBNET.(i+1)/24; netdelay reads every packet a namespace sends, holds it
// for -delay and writes it into the namespace it is addressed to — a
// switch whose every port is a one-way delay. A tbf qdisc on a
// namespace's tun0 caps its rate as on any link. It runs until killed,
// after printing "ready". Linux only; needs root.
//
//	netdelay -ns PREFIX -count 4 -subnet A.B.C -delay 50ms  (testdata/bench-longlinks.sh)
package main

import (
	"flag"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func main() {
	ns := flag.String("ns", "", "the namespaces' prefix: PREFIX0, PREFIX1, …")
	count := flag.Int("count", 2, "how many namespaces")
	subnet := flag.String("subnet", "", "the first three octets of the namespaces' /24 (the script that made them names it)")
	delay := flag.Duration("delay", 50*time.Millisecond, "how long every packet is held, each way")
	mtu := flag.Int("mtu", 65000, "the TUN devices' MTU: large packets keep a second's packets few")
	flag.Parse()
	if err := run(*ns, *count, *subnet, *delay, *mtu); err != nil {
		fmt.Fprintln(os.Stderr, "netdelay:", err)
		os.Exit(1)
	}
}

// held is a packet and when it may go on.
type held struct {
	at  time.Time
	pkt []byte
}

func run(prefix string, count int, subnet string, delay time.Duration, mtu int) error {
	if prefix == "" || subnet == "" || count < 2 || count > 250 {
		return fmt.Errorf("want -ns, -subnet and a -count of 2 to 250")
	}
	base, err := netip.ParseAddr(subnet + ".0")
	if err != nil || !base.Is4() {
		return fmt.Errorf("-subnet %q: want three octets", subnet)
	}
	tuns := make([]*os.File, count)
	for i := range tuns {
		name := fmt.Sprintf("%s%d", prefix, i)
		if tuns[i], err = tunIn(name); err != nil {
			return fmt.Errorf("namespace %s: %w", name, err)
		}
		addr := fmt.Sprintf("%s.%d/24", subnet, i+1)
		for _, args := range [][]string{{"addr", "add", addr, "dev", "tun0"}, {"link", "set", "tun0", "mtu", fmt.Sprint(mtu), "up"}} {
			if out, err := exec.Command("ip", append([]string{"-n", name}, args...)...).CombinedOutput(); err != nil {
				return fmt.Errorf("ip -n %s %v: %w: %s", name, args, err, out)
			}
		}
	}
	queues := make([]chan held, count)
	for i := range queues {
		queues[i] = make(chan held, 1<<14)
		go deliver(tuns[i], queues[i])
	}
	for i := range tuns {
		go forward(tuns[i], queues, base, delay, mtu)
	}
	fmt.Println("ready")
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	return nil
}

// tunIn opens a TUN device tun0 inside network namespace name: the
// device stays there, its file here.
func tunIn(name string) (*os.File, error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	here, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return nil, err
	}
	defer here.Close()
	there, err := os.Open("/var/run/netns/" + name)
	if err != nil {
		return nil, err
	}
	defer there.Close()
	if err := unix.Setns(int(there.Fd()), unix.CLONE_NEWNET); err != nil {
		return nil, fmt.Errorf("setns: %w", err)
	}
	defer unix.Setns(int(here.Fd()), unix.CLONE_NEWNET)
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, err
	}
	ifr, err := unix.NewIfreq("tun0")
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	ifr.SetUint16(unix.IFF_TUN | unix.IFF_NO_PI)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("TUNSETIFF: %w", err)
	}
	return os.NewFile(uintptr(fd), "tun0@"+name), nil
}

// forward reads what one namespace sends and queues each IPv4 packet for
// the namespace it is addressed to, to go on after delay; what is
// addressed elsewhere, or finds its queue full, is dropped, as a router
// would.
func forward(tun *os.File, queues []chan held, base netip.Addr, delay time.Duration, mtu int) {
	buf := make([]byte, mtu+64)
	prefix := base.As4()
	for {
		n, err := tun.Read(buf)
		if err != nil {
			return
		}
		if n < 20 || buf[0]>>4 != 4 || [3]byte(buf[16:19]) != [3]byte(prefix[:3]) {
			continue
		}
		to := int(buf[19]) - 1
		if to < 0 || to >= len(queues) {
			continue
		}
		select {
		case queues[to] <- held{at: time.Now().Add(delay), pkt: append([]byte(nil), buf[:n]...)}:
		default:
		}
	}
}

// deliver writes each packet into its namespace once its time has come;
// the queue is in time order, as every packet is held alike.
func deliver(tun *os.File, q <-chan held) {
	for h := range q {
		if d := time.Until(h.at); d > 0 {
			time.Sleep(d)
		}
		if _, err := tun.Write(h.pkt); err != nil {
			continue
		}
	}
}
