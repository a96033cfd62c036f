# Thin wrappers around scripts/ (the scripts are the source of truth).
.PHONY: setup test demo images base up down logs
setup:  ; ./scripts/setup.sh
test:   ; ./scripts/test.sh $(ARGS)
demo:   ; ./scripts/demo.sh
images: ; ./scripts/build_images.sh
base:   ; ./scripts/bootstrap_base_image.sh
up:     ; docker compose up -d --wait
down:   ; docker compose down
logs:   ; docker compose logs -f env-server
