// The CronJob controller's own code as an oracle (tests/schedule/test_cronjob_oracle.py):
// k8s.io/kubernetes's pkg/controller/cronjob, reached through the wrappers of
// _overlay/k8s.io/kubernetes/pkg/controller/cronjob/export_oracle.go, which
// `go build -overlay` adds to that package (tests/schedule/oracles.py).
//
// Reads JSON lines, one CronJob and an instant each:
//
//	{"name", "schedule", "zone" ("" for none), "created_s", "last_s" (null: never scheduled),
//	 "deadline_s" (startingDeadlineSeconds, null for none), "now_ms"}
//
// and writes for each
//
//	{"recent_s"  mostRecentScheduleTime(includeStartingDeadlineSeconds) in epoch s, or null,
//	 "missed"    its missed-schedules class: none, few or many (more than 100),
//	 "recent_name" getJobName for recent_s,
//	 "job"       {"name", "scheduled_timestamp"} of the Job syncCronJob created, or null,
//	 "events"    the reasons of the events syncCronJob recorded,
//	 "error", "hung" (the controller did not return within 5 s)}
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/kubernetes/pkg/controller/cronjob"
)

type request struct {
	Name      string `json:"name"`
	Schedule  string `json:"schedule"`
	Zone      string `json:"zone"`
	CreatedS  int64  `json:"created_s"`
	LastS     *int64 `json:"last_s"`
	DeadlineS *int64 `json:"deadline_s"`
	NowMs     int64  `json:"now_ms"`
}

type job struct {
	Name               string `json:"name"`
	ScheduledTimestamp string `json:"scheduled_timestamp"`
}

type response struct {
	RecentS    *int64   `json:"recent_s"`
	Missed     string   `json:"missed"`
	RecentName string   `json:"recent_name"`
	Job        *job     `json:"job"`
	Events     []string `json:"events"`
	Error      string   `json:"error,omitempty"`
	Hung       bool     `json:"hung"`
}

func cronJob(req request) *batchv1.CronJob {
	cj := &batchv1.CronJob{
		ObjectMeta: metav1.ObjectMeta{
			Name:              req.Name,
			Namespace:         "oracle",
			UID:               "oracle-uid",
			CreationTimestamp: metav1.Unix(req.CreatedS, 0),
		},
		Spec: batchv1.CronJobSpec{
			Schedule:                req.Schedule,
			StartingDeadlineSeconds: req.DeadlineS,
			ConcurrencyPolicy:       batchv1.AllowConcurrent,
		},
	}
	if req.Zone != "" {
		cj.Spec.TimeZone = &req.Zone
	}
	if req.LastS != nil {
		last := metav1.Unix(*req.LastS, 0)
		cj.Status.LastScheduleTime = &last
	}
	return cj
}

func answer(req request) response {
	now := time.UnixMilli(req.NowMs)
	resp := response{Events: []string{}}
	recent, missed, err := cronjob.MostRecentScheduleTime(cronJob(req), now, true)
	resp.Missed = missed
	if err != nil {
		resp.Error = err.Error()
	}
	if recent != nil {
		s := recent.Unix()
		resp.RecentS = &s
		resp.RecentName = cronjob.JobName(cronJob(req), *recent)
	}
	created, events, err := cronjob.SyncOnce(cronJob(req), now)
	if events != nil {
		resp.Events = events
	}
	if err != nil && resp.Error == "" {
		resp.Error = err.Error()
	}
	if created != nil {
		resp.Job = &job{
			Name:               created.Name,
			ScheduledTimestamp: created.Annotations[batchv1.CronJobScheduledTimestampAnnotation],
		}
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
		// robfig's Next can search forever (Pacific/Apia's skipped day): give up on such a case,
		// whose goroutine spins until the process exits.
		done := make(chan response, 1)
		go func() { done <- answer(req) }()
		var resp response
		select {
		case resp = <-done:
		case <-time.After(5 * time.Second):
			resp = response{Events: []string{}, Hung: true}
		}
		if err := enc.Encode(resp); err != nil {
			fmt.Fprintln(os.Stderr, "write:", err)
			os.Exit(2)
		}
	}
	if err := in.Err(); err != nil {
		fmt.Fprintln(os.Stderr, "read:", err)
		os.Exit(2)
	}
}
