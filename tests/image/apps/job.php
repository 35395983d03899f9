<?php
// The app's own job: one line per run in the side-effect file, then as long as the test asks.
$out = getenv('SIDE_EFFECTS') ?: '/effects/runs.log';
file_put_contents($out, 'php ' . gethostname() . ' ' . getmypid() . "\n", FILE_APPEND | LOCK_EX);
fwrite(STDOUT, "php job ran\n");
sleep((int) (getenv('JOB_SLEEP') ?: 0));
