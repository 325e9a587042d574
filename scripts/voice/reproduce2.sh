#!/bin/sh
# Second round: layer 4 (as good as 5 and 6 on the 2 h grid, better mel) -- levels again, then full data.
set -e
cd "$(dirname "$0")/../.."
T="env PYTHONPATH=. OMP_NUM_THREADS=1 nice -n 19 python scripts/voice/tokenizer.py"
$T train --name g2h_L4_3p8 --layer 4 --levels 3^8 --train-hours 2 --epochs 10
$T train --name g2h_L4_cont6 --layer 4 --levels 3^6 --continuous --train-hours 2 --epochs 10
$T train --name g2h_L4_3p7 --layer 4 --levels 3,3,3,3,3,3,3 --train-hours 2 --epochs 10
$T train --name full_L4_3p6 --layer 4 --levels 3^6 --epochs 10
$T train --name full_L4_3p8 --layer 4 --levels 3^8 --epochs 10
