# The task's hidden tests: laid into the work directory only after the agent is done.
. ./calc.sh || exit 1
failed=0
check() {
    if [ "$2" = "$3" ]; then
        echo "ok: $1"
    else
        echo "FAILED: $1: got '$2', want '$3'"
        failed=$((failed + 1))
    fi
}
check "add 2 3" "$(add 2 3)" 5
check "add -1 1" "$(add -1 1)" 0
check "mul 2 3" "$(mul 2 3)" 6
# The last line is the verdict's reason.
if [ "$failed" -gt 0 ]; then
    echo "FAILED ($failed of 3 tests)"
    exit 1
fi
echo "all 3 tests passed"
