# The app's own job, for the images without PHP or Node: one line per run in the side-effect
# file, then as long as the test asks. Shell built-ins only, and `sleep`, which BusyBox runs
# as its own applet: the image of one static binary has nothing else. The line also says
# whether the runner's own library path or PyInstaller's variables reached the job.
read -r host </proc/sys/kernel/hostname
echo "${JOB_APP:-sh} $host $$ ld=${LD_LIBRARY_PATH-unset} pyi=${_PYI_ARCHIVE_FILE-unset}" \
    >>"${SIDE_EFFECTS:-/effects/runs.log}"
echo "sh job ran"
sleep "${JOB_SLEEP:-0}"
