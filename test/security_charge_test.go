package test

import (
	"context"
	binaryenc "encoding/binary"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	phasegatev1 "github.com/phasegate/phasegate/api/phasegate/v1"
)

// policyLoopEnv makes this test binary, run as another user, a tenant that
// leases a slot over a control socket and then sets the largest egress
// policy on it in a loop: "SOCKET|SECONDS". It prints the codes of the
// policy changes and how long the loop took, as JSON.
const policyLoopEnv = "PHASEGATE_TEST_POLICY_LOOP"

// policyLoopRate is the daemon's --control-rate for the tenant's loop.
const policyLoopRate = 20

func init() {
	if v := os.Getenv(policyLoopEnv); v != "" {
		os.Exit(loopLargePolicies(v))
	}
}

// largestPolicy is a policy of 4,096 ranges in each list, the most a lease
// may have; first makes each call's ranges its own.
func largestPolicy(first byte) *phasegatev1.EgressPolicy {
	list := func(first byte) []string {
		out := make([]string, 4096)
		for i := range out {
			var a [4]byte
			binaryenc.BigEndian.PutUint32(a[:], uint32(first)<<24|uint32(i)<<8)
			out[i] = netip.PrefixFrom(netip.AddrFrom4(a), 24).String()
		}
		return out
	}
	return &phasegatev1.EgressPolicy{Allow: list(first), Deny: list(first + 1)}
}

func loopLargePolicies(spec string) int {
	sock, secs, ok := strings.Cut(spec, "|")
	n, err := strconv.Atoi(secs)
	if !ok || err != nil {
		fmt.Fprintf(os.Stderr, "%s=%q: want SOCKET|SECONDS\n", policyLoopEnv, spec)
		return 2
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer conn.Close()
	c := phasegatev1.NewSlotsClient(conn)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	acq, err := c.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "tenant-b-policies"})
	if err != nil {
		fmt.Fprintln(os.Stderr, "acquire:", err)
		return 1
	}
	res := map[string]int{}
	start := time.Now()
	for k := 0; time.Since(start) < time.Duration(n)*time.Second; k++ {
		_, err := c.SetEgressPolicy(ctx, &phasegatev1.SetEgressPolicyRequest{Index: acq.GetSlot().GetIndex(), LeaseId: acq.GetLeaseId(),
			EgressPolicy: largestPolicy(byte(20 + 2*(k%50)))})
		res["policy "+status.Code(err).String()]++
		// Every call spends one of the rate, refused or not: a tenant
		// retrying at the rate itself never fills its bucket again. This
		// one retries at half of it, so that its bucket refills and one
		// in each refill is written while root works.
		time.Sleep(2 * time.Second / policyLoopRate)
	}
	res["ms"] = int(time.Since(start).Milliseconds())
	b, _ := json.Marshal(res)
	fmt.Println(string(b))
	return 0
}

// A permitted tenant that writes the largest egress policies in a loop
// spends its rate by their size (docs/SECURITY.md, "a tenant's large
// policies"): each costs it a full bucket, so that it writes one per
// refill and is refused the rest, while root's policy changes and its
// leased workload go on untouched.
func TestLargePoliciesSpendATenantsRate(t *testing.T) {
	pub := newPublicDir(t)
	h := newHost(t)
	sock := pub.dir + "/control.sock"
	const rate, secs = policyLoopRate, 6
	d := start(t, nil, h.args(freePort(t), "--slots=16", "--control-socket="+sock, "--control-group=nogroup",
		"--allow=uid:65534=tenant-b-*", fmt.Sprintf("--control-rate=%d", rate))...)
	d.waitServing(time.Minute)
	root := d.slots()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	victim, err := root.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "victim",
		EgressPolicy: &phasegatev1.EgressPolicy{Allow: []string{"198.51.100.0/24"}, Deny: []string{"203.0.113.0/24"}}})
	if err != nil {
		t.Fatal(err)
	}
	vi := victim.GetSlot()
	inside, _, _ := strings.Cut(vi.GetInsideAddress(), "/")
	work := startWorkload(t, vi.GetIndex(), vi.GetNetnsPath(), inside)
	before := observeVictim(t, root, vi.GetIndex())
	mine, err := root.Acquire(ctx, &phasegatev1.AcquireRequest{Owner: "root-own"})
	if err != nil {
		t.Fatal(err)
	}
	stopHealth := watchHealth(t, d)

	// Root changes its own lease's policy throughout.
	stopRoot := changePolicyEvery50ms(ctx, root, mine)
	res, err := runTenantPolicyLoop(pub, sock, secs)
	rootTimes, rootErrs := stopRoot()
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(rootTimes)
	var p50, p99 time.Duration
	if len(rootTimes) > 0 {
		p50, p99 = rootTimes[len(rootTimes)/2], rootTimes[len(rootTimes)*99/100]
	}
	t.Logf("the tenant's loop of %d ms: %v; root's %d policy changes meanwhile: p50 %v, p99 %v", res["ms"], res, len(rootTimes), p50, p99)

	// A policy of 8,192 ranges costs 1 + 128 calls, capped at the bucket
	// (twice the rate): the first is paid by the full bucket, each one
	// after it by a whole refill of burst/rate seconds (longer, as each
	// refused call spends one too); one more for the clocks.
	burst := 2 * rate
	most := 2 + res["ms"]*rate/burst/1000
	accepted, refused := res["policy OK"], res["policy ResourceExhausted"]
	if accepted == 0 || accepted > most || refused == 0 {
		t.Errorf("the tenant's largest policies: %d accepted, %d refused with ResourceExhausted (%v); want at least one accepted, at most %d (one per refill of the bucket), and the rest refused", accepted, refused, res, most)
	}
	if other := res["policy OK"] + res["policy ResourceExhausted"]; other != sumPrefixed(res, "policy ") {
		t.Errorf("the tenant's policy changes ended with other codes: %v", res)
	}
	if len(rootTimes) == 0 || len(rootErrs) != 0 {
		t.Errorf("root's policy changes during the loop: %d of %d failed: %v", len(rootErrs), len(rootTimes), rootErrs)
	}
	polls, failed := stopHealth()
	if polls == 0 || failed != 0 {
		t.Errorf("health during the loop: %d of %d polls not 200", failed, polls)
	}
	before.same(t, observeVictim(t, root, vi.GetIndex()), "a tenant's loop of large policies")
	if ok, bad, last := work.finish(); ok == 0 || bad != 0 {
		t.Errorf("the victim's workload: %d answered, %d failed (last: %v)", ok, bad, last)
	}
	d.signal(syscall.SIGTERM)
	if code := d.wait(time.Minute); code != 0 {
		t.Fatalf("stop: exit %d", code)
	}
	if !strings.Contains(d.Output(), `principal=uid:65534`) || !strings.Contains(d.Output(), `msg="control call refused"`) {
		t.Error("no audit line of nobody's refused calls")
	}
	h.decommission(h.prefix)
}

// changePolicyEvery50ms sets a new policy on root's own lease every
// 50 ms until the returned function is called, which returns how long
// each change took and the errors.
func changePolicyEvery50ms(ctx context.Context, root phasegatev1.SlotsClient, mine *phasegatev1.AcquireResponse) (stop func() ([]time.Duration, []error)) {
	var (
		times []time.Duration
		errs  []error
		wg    sync.WaitGroup
	)
	done := make(chan struct{})
	wg.Go(func() {
		for k := 0; ; k++ {
			select {
			case <-done:
				return
			case <-time.After(50 * time.Millisecond):
			}
			begin := time.Now()
			_, err := root.SetEgressPolicy(ctx, &phasegatev1.SetEgressPolicyRequest{Index: mine.GetSlot().GetIndex(), LeaseId: mine.GetLeaseId(),
				EgressPolicy: &phasegatev1.EgressPolicy{Allow: []string{fmt.Sprintf("10.%d.0.0/16", k%250)}}})
			times = append(times, time.Since(begin))
			if err != nil {
				errs = append(errs, err)
			}
		}
	})
	return func() ([]time.Duration, []error) {
		close(done)
		wg.Wait()
		return times, errs
	}
}

// runTenantPolicyLoop runs the tenant's loop of largest policies as
// nobody on sock for secs seconds and returns its counts (see
// loopLargePolicies).
func runTenantPolicyLoop(pub *publicDir, sock string, secs int) (map[string]int, error) {
	cmd := exec.Command("runuser", "-u", "nobody", "--", pub.testBinary)
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s|%d", policyLoopEnv, sock, secs))
	cmd.Dir = pub.dir
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("the tenant's loop as nobody: %v %s", err, out)
	}
	res := map[string]int{}
	if err := json.Unmarshal(out, &res); err != nil {
		return nil, fmt.Errorf("the tenant's loop as nobody: %q: %v", out, err)
	}
	return res, nil
}

// sumPrefixed adds the counts of res whose key starts with prefix.
func sumPrefixed(res map[string]int, prefix string) int {
	n := 0
	for k, v := range res {
		if strings.HasPrefix(k, prefix) {
			n += v
		}
	}
	return n
}
