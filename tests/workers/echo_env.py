import os

print(f"rank={os.environ['AIOCCL_RANK']} world={os.environ['AIOCCL_WORLD_SIZE']} "
      f"local={os.environ['AIOCCL_LOCAL_RANK']}")
