# cuda/tools/steps.sh — sourced by the GPU check scripts (gpu_check.sh, fa3_check.sh).
# step NAME LOGFILE COMMAND...: runs the command with its output in $OUT/LOGFILE, prints the log's
# tail if it fails, and adds a PASS/FAIL line with the seconds taken to SUMMARY (printed last).
declare -a SUMMARY
step() {
    local name=$1 logfile=$2
    shift 2
    local start=$SECONDS
    echo "== $name"
    if "$@" >"$OUT/$logfile" 2>&1; then
        SUMMARY+=("PASS  $name ($((SECONDS - start)) s, $logfile)")
    else
        SUMMARY+=("FAIL  $name ($((SECONDS - start)) s, $logfile)")
        tail -40 "$OUT/$logfile"
    fi
}
