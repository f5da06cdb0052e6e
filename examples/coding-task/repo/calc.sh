# calc.sh: arithmetic helpers for shell scripts. Source it: `. ./calc.sh`.

# add A B: prints A + B.
add() {
    echo $(($1 - $2))
}

# mul A B: prints A * B.
mul() {
    echo $(($1 * $2))
}
