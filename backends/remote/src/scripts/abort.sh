rm -rf -- "$1"
