// Not part of Kubernetes: the oracle (oracles/cronjob/main.go) adds this file to k8s.io/kubernetes's
// pkg/controller/cronjob with `go build -overlay`, so that it can call the controller's own
// unexported code as it is, without a copy. Only thin wrappers here: no logic of our own.

package cronjob

import (
	"context"
	"strings"
	"time"

	"github.com/go-logr/logr"
	batchv1 "k8s.io/api/batch/v1"
	"k8s.io/client-go/tools/record"
	"k8s.io/klog/v2"
	"k8s.io/kubernetes/pkg/util/parsers"
)

// SyncOnce is one syncCronJob of the controller at now, for a CronJob with no Jobs yet, with
// the package's own fake Job and CronJob controls (injection.go): the Job it created, if any,
// and the reasons of the events it recorded.
func SyncOnce(cj *batchv1.CronJob, now time.Time) (*batchv1.Job, []string, error) {
	jobs := &fakeJobControl{}
	recorder := record.NewFakeRecorder(1000)
	jm := &ControllerV2{
		recorder:       recorder,
		jobControl:     jobs,
		cronJobControl: &fakeCJControl{},
		now:            func() time.Time { return now },
	}
	ctx := klog.NewContext(context.Background(), logr.Discard())
	_, _, err := jm.syncCronJob(ctx, cj, nil)
	close(recorder.Events)
	var reasons []string
	for event := range recorder.Events {
		if fields := strings.Fields(event); len(fields) > 1 {
			reasons = append(reasons, fields[1]) // "<type> <reason> <message>"
		}
	}
	if len(jobs.Jobs) == 0 {
		return nil, reasons, err
	}
	return &jobs.Jobs[0], reasons, err
}

// MostRecentScheduleTime is mostRecentScheduleTime with the schedule parsed as syncCronJob
// parses it (formatSchedule, then ParseCronScheduleWithPanicRecovery).
func MostRecentScheduleTime(cj *batchv1.CronJob, now time.Time, includeStartingDeadlineSeconds bool) (*time.Time, string, error) {
	sched, err := parsers.ParseCronScheduleWithPanicRecovery(formatSchedule(cj, nil))
	if err != nil {
		return nil, "", err
	}
	_, recent, missed, err := mostRecentScheduleTime(cj, now, sched, includeStartingDeadlineSeconds)
	return recent, missed.String(), err
}

// JobName is getJobName: the name the controller gives the Job of a scheduled time.
func JobName(cj *batchv1.CronJob, scheduledTime time.Time) string {
	return getJobName(cj, scheduledTime)
}
