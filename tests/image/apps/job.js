// The app's own job: one line per run in the side-effect file, then as long as the test asks.
const fs = require("fs");
const os = require("os");
const out = process.env.SIDE_EFFECTS || "/effects/runs.log";
fs.appendFileSync(out, `node ${os.hostname()} ${process.pid}\n`);
console.log("node job ran");
setTimeout(() => {}, 1000 * Number(process.env.JOB_SLEEP || 0));
