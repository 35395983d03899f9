// The oracle of the differential test (tests/schedule/test_robfig_oracle.py): robfig/cron
// v3.0.1, the parser and scheduler of the Kubernetes CronJob controller, from the Go module
// proxy, pinned by go.sum.
//
// Reads JSON lines {"expr", "zone", "next": [unix s], "match": [unix s]}; for each writes
// {"ok", "error", "every_s", "next": [unix s or null], "hung": [index], "match": [bool]}:
//   ok      cron.ParseStandard(expr) accepts it (what the API server checks);
//   next    Next(t) of the schedule as the controller builds it: "TZ=<zone> <expr>";
//   hung    the indexes of "next" whose Next did not return within 2 s (it loops forever at
//           Pacific/Apia's skipped day); their goroutines spin until the process exits;
//   match   whether t is a second the parsed fields match (robfig's own field and day rules,
//           without its search), to tell a wrong search from a wrong answer.
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/robfig/cron/v3"
)

type request struct {
	Expr  string  `json:"expr"`
	Zone  string  `json:"zone"`
	Next  []int64 `json:"next"`
	Match []int64 `json:"match"`
}

type response struct {
	Ok     bool     `json:"ok"`
	Error  string   `json:"error,omitempty"`
	EveryS *int64   `json:"every_s"`
	Next   []*int64 `json:"next"`
	Hung   []int    `json:"hung"`
	Match  []bool   `json:"match"`
}

func dayMatches(s *cron.SpecSchedule, t time.Time) bool {
	domMatch := 1<<uint(t.Day())&s.Dom > 0
	dowMatch := 1<<uint(t.Weekday())&s.Dow > 0
	if s.Dom&(1<<63) > 0 || s.Dow&(1<<63) > 0 {
		return domMatch && dowMatch
	}
	return domMatch || dowMatch
}

func matches(s *cron.SpecSchedule, t time.Time) bool {
	t = t.In(s.Location)
	return 1<<uint(t.Second())&s.Second > 0 && 1<<uint(t.Minute())&s.Minute > 0 &&
		1<<uint(t.Hour())&s.Hour > 0 && dayMatches(s, t) && 1<<uint(t.Month())&s.Month > 0
}

func parse(expr string) (sched cron.Schedule, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic: %v", r)
		}
	}()
	return cron.ParseStandard(expr)
}

func answer(req request) response {
	resp := response{Next: []*int64{}, Hung: []int{}, Match: []bool{}}
	if _, err := parse(req.Expr); err != nil {
		resp.Error = err.Error()
		return resp
	}
	resp.Ok = true
	loc, err := time.LoadLocation(req.Zone)
	if err != nil {
		resp.Error = err.Error()
		return resp
	}
	sched, err := parse(fmt.Sprintf("TZ=%s %s", req.Zone, req.Expr))
	if err != nil {
		resp.Error = err.Error()
		return resp
	}
	if every, ok := sched.(cron.ConstantDelaySchedule); ok {
		s := int64(every.Delay / time.Second)
		resp.EveryS = &s
		return resp
	}
	spec := sched.(*cron.SpecSchedule)
	spec.Location = loc
	for i, t := range req.Next {
		done := make(chan time.Time, 1)
		go func(t int64) { done <- spec.Next(time.Unix(t, 0).UTC()) }(t)
		var n time.Time
		select {
		case n = <-done:
		case <-time.After(2 * time.Second):
			resp.Hung = append(resp.Hung, i)
		}
		if n.IsZero() {
			resp.Next = append(resp.Next, nil)
		} else {
			u := n.Unix()
			resp.Next = append(resp.Next, &u)
		}
	}
	for _, t := range req.Match {
		resp.Match = append(resp.Match, matches(spec, time.Unix(t, 0)))
	}
	return resp
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 1<<26)
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	enc := json.NewEncoder(out)
	for in.Scan() {
		var req request
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			fmt.Fprintln(os.Stderr, "bad request:", err)
			os.Exit(2)
		}
		if err := enc.Encode(answer(req)); err != nil {
			fmt.Fprintln(os.Stderr, "write:", err)
			os.Exit(2)
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "read:", err)
		os.Exit(2)
	}
}
